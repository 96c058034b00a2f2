# MLServer (Seldon's Open Inference Protocol server) with its scikit-learn runtime, in its own
# virtualenv (.venv-mlserver): the model server of the Open Inference Protocol tests and of
# make bench-oip. models/mlserver/train.py, run with its python, trains the models it serves.
# Included from the Makefile (it uses PYTHON).

MLSERVER_VENV := .venv-mlserver

.PHONY: mlserver
mlserver: $(MLSERVER_VENV)/.installed ## Make MLServer's virtualenv (.venv-mlserver) with mlserver-sklearn, for the Open Inference Protocol tests.

# $(call own_venv,VENV,REQUIREMENTS): a model server's own virtualenv, its pins installed; the
# recipe of VENV/.installed.
define own_venv
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/pip install --quiet --disable-pip-version-check -r $(2)
	@touch $(1)/.installed
endef

$(MLSERVER_VENV)/.installed: models/mlserver/requirements.txt
	$(call own_venv,$(MLSERVER_VENV),$<)
