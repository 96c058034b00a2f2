# MLServer (Seldon's Open Inference Protocol server) with its scikit-learn runtime, in its own
# virtualenv (.venv-mlserver): the model server of the Open Inference Protocol tests and of
# make bench-oip. models/mlserver/train.py, run with its python, trains the models it serves.
# Included from the Makefile (it uses PYTHON).

MLSERVER_VENV := .venv-mlserver

.PHONY: mlserver
mlserver: $(MLSERVER_VENV)/.installed ## Make MLServer's virtualenv (.venv-mlserver) with mlserver-sklearn, for the Open Inference Protocol tests.

$(MLSERVER_VENV)/.installed: models/mlserver/requirements.txt
	test -x $(MLSERVER_VENV)/bin/python || $(PYTHON) -m venv $(MLSERVER_VENV)
	$(MLSERVER_VENV)/bin/pip install --quiet --disable-pip-version-check \
		-r models/mlserver/requirements.txt
	@touch $@
