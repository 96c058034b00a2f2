# KServe's Python model server and its REST client (the kserve package) with scikit-learn, in their
# own virtualenv (.venv-kserve): the team's own kserve.Model of models/kserve/ serving the digits
# model of models/mlserver/train.py, and InferenceRESTClient calling the gateway, in the Open
# Inference Protocol tests. Included from the Makefile after hack/mlserver.mk (its own_venv).

KSERVE_VENV := .venv-kserve

.PHONY: kserve
kserve: $(KSERVE_VENV)/.installed ## Make KServe's virtualenv (.venv-kserve) with scikit-learn, for the Open Inference Protocol tests.

$(KSERVE_VENV)/.installed: models/kserve/requirements.txt
	$(call own_venv,$(KSERVE_VENV),$<)
