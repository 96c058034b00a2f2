# modelroll-keda: KEDA's operator and metrics adapter, for the chart's autoscaling.keda.install.
# hack/keda.mk builds both from KEDA's Go module (`make keda-bins`: static, CGO off); they live
# outside the repository root's build context, so hack/images/build.sh copies them, this file and
# the host's CA bundle (for triggers that query over HTTPS) into a context of their own, named as
# below, and builds there. The chart runs each with its own command (/keda-operator,
# /keda-adapter), as KEDA's own images do.
FROM scratch
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY keda-operator /keda-operator
COPY keda-adapter /keda-adapter
# Nothing is written but to /tmp and /certs, volumes of the chart's: the root filesystem can be
# mounted read-only.
USER 10001:10001
ENTRYPOINT ["/keda-operator"]
