# modelroll's images, one per component, built from the repository root. COMPONENT is the
# component's folder: operator, gateway, sidecar, models (modelroll-encoder, the real sentence
# encoder) or standins (modelroll-demo, the stand-in model servers):
#   docker build --build-arg COMPONENT=operator -t modelroll-operator:0.1.0 .
# Each component's pyproject.toml names its image and the command the image runs
# ([tool.modelroll.image]); `make images` builds them all (hack/images/build.sh).
# PYTHON_IMAGE is any Debian-based image with python3 (3.11 or later) and its venv module
# (`make images` passes one built from Debian packages on machines without a registry:
# hack/images/base-image.sh).
# Plain Dockerfile syntax: it builds with BuildKit and with the classic builder alike.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG COMPONENT
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY constraints.txt ./
COPY hack/images/install.py hack/images/install.py
# The project folders (pyproject.toml, readme, package; .dockerignore drops caches): install.py
# installs the component's and those of the projects it depends on (common/: the HTTP server,
# the routes document, the API connection, flag helpers; sidecar/: the model protocol the
# stand-ins count lengths with).
COPY common common
COPY sidecar sidecar
COPY gateway gateway
COPY operator operator
COPY models models
COPY standins standins
# A virtualenv with the projects and their dependencies at the versions pinned for the whole
# repository; the final stage copies it whole, so no wheel or compiler is left in the image.
RUN test -n "$COMPONENT" || { echo "give the component: --build-arg COMPONENT=<folder>" >&2; exit 1; } \
    && python3 -m venv /opt/modelroll \
    && python3 hack/images/install.py "$COMPONENT" /opt/modelroll \
    && find /opt/modelroll -name __pycache__ -prune -exec rm -rf {} +

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/modelroll/bin:$PATH HOME=/tmp
RUN groupadd --gid 10001 modelroll \
    && useradd --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
        --shell /usr/sbin/nologin modelroll
COPY --from=build /opt/modelroll /opt/modelroll
# Nothing is written outside /tmp: the root filesystem can be mounted read-only.
USER 10001:10001
WORKDIR /tmp
# The component's command (install.py writes it), which replaces the shell that starts it.
ENTRYPOINT ["modelroll-image"]
