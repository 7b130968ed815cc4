# lakemirror daemon image: Python 3.11, Java 17, Delta's jars baked in (no network at start).
# The same image runs the Spark Connect server of deploy/k8s/spark-connect.yaml: pyspark's own
# spark-connect jar with Delta's jars and SQL extension (no Delta Connect plugin), its Python workers
# being this venv, which has lakemirror and Connect's extras (pandas < 3, grpcio, ...; pyproject.toml).
#   docker build -t lakemirror .
#   docker run --rm -v $PWD/pipeline.yaml:/etc/lakemirror/pipeline.yaml -p 9464:9464 lakemirror

# Debian's openjdk-17 and tini are not pinned to a version (hadolint DL3008): bookworm replaces a
# package's version with each security update and drops the old one, so a pin breaks the build.
FROM python:3.11-slim-bookworm AS build
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY lakemirror ./lakemirror
COPY daemon ./daemon
COPY supervisor ./supervisor
COPY sources ./sources
COPY sinks ./sinks
COPY checkpoints ./checkpoints
# tools/ (the demos, the local Debezium stack) is not the daemon's, but `pip install .` installs the one
# package list of pyproject.toml: leaving it out would take a second list for the image, the drift
# tests/unit/test_packaging.py guards against. Nothing `lakemirror run` loads imports it.
COPY tools ./tools
RUN python -m venv /opt/lakemirror/venv \
 && /opt/lakemirror/venv/bin/pip install --no-cache-dir . \
 && /opt/lakemirror/venv/bin/lakemirror fetch-jars --dest /opt/lakemirror/jars

FROM python:3.11-slim-bookworm
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/lakemirror --create-home lakemirror
COPY --from=build /opt/lakemirror /opt/lakemirror
ENV PATH=/opt/lakemirror/venv/bin:$PATH \
    LAKEMIRROR_JARS_DIR=/opt/lakemirror/jars \
    LAKEMIRROR_CLASS_ARCHIVE_DIR=/opt/lakemirror/class-archive \
    LAKEMIRROR_HTTP__HOST=0.0.0.0 \
    PYTHONUNBUFFERED=1
# The driver JVM's class archive, recorded by this stage's JVM: the embedded session maps it at each start.
RUN lakemirror build-class-archive
USER 10001
WORKDIR /var/lib/lakemirror
EXPOSE 9464
HEALTHCHECK --interval=30s --timeout=5s \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9464/healthz', timeout=4)"]
# Exec form: tini is PID 1 and forwards SIGTERM to the daemon, which drains and exits 0.
ENTRYPOINT ["/usr/bin/tini", "--", "lakemirror"]
CMD ["run", "/etc/lakemirror/pipeline.yaml"]
