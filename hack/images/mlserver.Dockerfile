# modelroll-mlserver: MLServer (Seldon's server of the Open Inference Protocol) with its
# scikit-learn runtime, and the scikit-learn models that models/mlserver/train.py trains, baked in
# as a model repository: /models/digits and /models/sentiment, each with its model-settings.json.
# For `spec.protocol: OpenInference` versions (examples/open-inference/): the command
# `mlserver start /models/digits` serves one model, on MLSERVER_HTTP_PORT (default 8080).
# hack/images/build.sh copies models/mlserver/requirements.txt (the pins of MLServer's own
# virtualenv, `make mlserver`), models/mlserver/train.py and this file into a context of their
# own, named as below, and builds there.
# PYTHON_IMAGE: the base every image of `make images` shares (hack/images/base-image.sh).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements.txt train.py /src/
# Trained here, by the scikit-learn that serves them (joblib files are read by the version that
# wrote them), from data scikit-learn ships: nothing is downloaded but the packages.
RUN python3 -m venv /opt/mlserver \
    && /opt/mlserver/bin/pip install --quiet -r /src/requirements.txt \
    && /opt/mlserver/bin/python /src/train.py /models \
    && find /opt/mlserver -name __pycache__ -prune -exec rm -rf {} +

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/mlserver/bin:$PATH HOME=/tmp
RUN groupadd --gid 10001 modelroll \
    && useradd --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
        --shell /usr/sbin/nologin modelroll
COPY --from=build /opt/mlserver /opt/mlserver
COPY --from=build /models /models
# MLServer writes its metrics' files and its environments' folder under its working directory:
# nothing is written outside /tmp, so the root filesystem can be mounted read-only.
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080
ENTRYPOINT ["mlserver"]
CMD ["start", "/models/digits"]
