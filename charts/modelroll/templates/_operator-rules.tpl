{{- /*
Written by `make generate` (hack/rbac.py) from operator/modelroll_operator/permissions.py, the
table of the API calls the operator makes: edit that, not this file.
*/}}

{{/*
The operator's permissions in each namespace it serves, as its code uses them.
*/}}
{{- define "modelroll.operator.rules" -}}
# kopf watches ModelVersions and patches our finalizer and its annotations onto them; an
# analysis reads its version and its baseline, and patches weights and its record.
- apiGroups: [modelroll.io]
  resources: [modelversions]
  verbs: [get, list, watch, patch]
# Each pass merge-patches its versions' status (conditions, the weight in force).
- apiGroups: [modelroll.io]
  resources: [modelversions/status]
  verbs: [get, patch]
# Children are adopted with blockOwnerDeletion, which needs this where the
# OwnerReferencesPermissionEnforcement admission plugin runs.
- apiGroups: [modelroll.io]
  resources: [modelversions/finalizers]
  verbs: [update]
# The routes ConfigMap: kopf watches it by name; each pass reads it, creates it when missing
# and merge-patches its model's key.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, patch]
# Only to replace a routes ConfigMap someone made immutable (it cannot be changed otherwise).
- apiGroups: [""]
  resources: [configmaps]
  resourceNames: [modelroll-routes]
  verbs: [delete]
# Managed versions' Deployments: kopf indexes them; server-side applied, deleted when a
# version leaves managed mode.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
# Managed versions' Services, like their Deployments; an analysis checks that a metrics URL
# names a Service of the version's namespace.
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch, delete]
# Events on ModelVersions, the operator's and kopf's (warnings).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# Canary analyses find the gateway pods, or the versions' sidecars, by label and read their
# /metrics (list only: no get, watch or anything that reaches into a pod).
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
{{- if .Values.operator.gatewayAPI }}
# The HTTPRoutes that claim models (labelled modelroll.io/model): kopf indexes them, a pass
# patches the backendRefs of the model's rule on the route read just before, an analysis lists
# them to find the claim.
- apiGroups: [gateway.networking.k8s.io]
  resources: [httproutes]
  verbs: [get, list, watch, patch]
{{- end }}
{{- if .Values.autoscaling.keda.enabled }}
# The ScaledObjects of versions with spec.scaling: server-side applied (which creates one that
# is missing), deleted when spec.scaling goes; never read or watched.
- apiGroups: [keda.sh]
  resources: [scaledobjects]
  verbs: [create, patch, delete]
{{- end }}
{{- if .Values.operator.peering }}
# kopf's peering in each served namespace: replicas announce themselves in it.
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end }}

{{/*
What the operator needs cluster-wide: kopf finds the CRDs it serves and the namespaces it
watches. With watchNamespaces, what lets it finish deleting a watched namespace: deleting the
namespace deletes the Role and RoleBinding with everything else in it, in no set order, while its
ModelVersions wait for the operator to remove our finalizer (modelroll.io/finalizer). A
ClusterRoleBinding is the only grant a namespace's deletion cannot take away (a RoleBinding, even
to a ClusterRole, lives in the namespace), so these rules are cluster-wide, and no more than
finishing a deletion takes; everything that creates, changes or deletes workloads stays in the
namespaced rules.
*/}}
{{- define "modelroll.operator.clusterRules" -}}
# kopf finds the CRDs of the resources it serves.
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
# kopf finds the namespaces it serves.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- if .Values.operator.watchNamespaces }}
# kopf's watch runs the on.delete handler; kopf patches our finalizer off (and records a
# handler's retries in annotations).
- apiGroups: [modelroll.io]
  resources: [modelversions]
  verbs: [list, watch, patch]
# The routes ConfigMap, by name only: the on.delete handler reads it and removes the deleted
# version's entry (it is never created in a namespace being deleted; create cannot be limited
# by name anyway).
- apiGroups: [""]
  resources: [configmaps]
  resourceNames: [modelroll-routes]
  verbs: [get, list, watch, patch]
# kopf handles no event before every indexed resource is listed in every served namespace, and
# an operator (re)started while the namespace is being deleted would otherwise be refused that
# listing, and stop.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [list, watch]
# Indexed, like Deployments.
- apiGroups: [""]
  resources: [services]
  verbs: [list, watch]
{{- if .Values.operator.gatewayAPI }}
# Indexed, like Deployments. Without patch, a version still in a claiming route's backendRefs
# keeps its finalizer until the namespace's deletion removes that route; the model then falls
# back to the routes ConfigMap, from which the version is removed.
- apiGroups: [gateway.networking.k8s.io]
  resources: [httproutes]
  verbs: [list, watch]
{{- end }}
{{- if .Values.operator.peering }}
# kopf watches the peering of every served namespace and keeps its replica's entry in it
# fresh.
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end }}
{{- if and .Values.operator.peering (not .Values.operator.watchNamespaces) }}
# kopf's peering when the operator serves every namespace.
- apiGroups: [kopf.dev]
  resources: [clusterkopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end }}
