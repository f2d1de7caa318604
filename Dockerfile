# One image for both containers of the sparkgate pod: `sparkgate webhook`, `sparkgate allocator`,
# `sparkgate certs sync`. Build: docker build -t <registry>/sparkgate:<tag> .   (docs/install.md)
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: the wheel and its dependencies into a virtualenv ------------------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/sparkgate
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sparkgate ./sparkgate
COPY webhook ./webhook
COPY allocator ./allocator
COPY certs ./certs
# Production packages only: kubesim and the sandbox wing (demo, local helpers) stay out of the image.
# Every dependency ships manylinux wheels, so no compiler is needed even here.
RUN /opt/sparkgate/bin/pip install .

# --- run: the virtualenv on a clean slim base, no build tools, no root -----------------------------------
FROM ${PYTHON_IMAGE}
ENV PATH=/opt/sparkgate/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/sparkgate /opt/sparkgate
RUN groupadd --system --gid 10001 sparkgate \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin sparkgate
USER 10001:10001
WORKDIR /tmp
EXPOSE 8443 8080
ENTRYPOINT ["sparkgate"]
CMD ["--help"]
