# One image for every Sluicegate role (migrate, api, relay, worker): the role is the command,
#   docker run sluicegate:latest api --host 0.0.0.0 --port 8000
# GPU workers: docker build --build-arg EXTRAS=vllm -t sluicegate-vllm:latest .
# EXTRAS is a comma-separated list of the optional dependency groups in pyproject.toml.
FROM python:3.11-slim

ARG EXTRAS=""
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# vLLM's Triton kernels compile a small C launcher at run time, so a vLLM image needs a C
# compiler (Python's headers are already in the base image). Other images stay without one:
# every base dependency ships a manylinux wheel.
RUN case ",${EXTRAS}," in \
      *,vllm,*) apt-get update \
        && apt-get install -y --no-install-recommends gcc libc6-dev \
        && rm -rf /var/lib/apt/lists/* ;; \
    esac

# A non-root user. /models exists and is theirs so a named volume mounted there (the vLLM
# worker's Hugging Face cache) starts out writable by them.
RUN useradd --create-home --uid 10001 --user-group sluicegate \
    && mkdir -p /models \
    && chown sluicegate:sluicegate /models

WORKDIR /app

# Dependencies first, from pyproject.toml alone, so a source change does not reinstall them
# (which matters for the multi-gigabyte vLLM image): install the project with no packages in
# it, then drop the empty project and keep its dependencies.
COPY pyproject.toml README.md ./
RUN pip install ".${EXTRAS:+[${EXTRAS}]}" \
    && pip uninstall -y sluicegate \
    && rm -rf build ./*.egg-info

COPY schemas ./schemas
COPY producers ./producers
COPY workers ./workers
COPY sluicegate ./sluicegate
COPY migrations ./migrations
RUN pip install --no-deps . \
    && rm -rf build ./*.egg-info \
    && sluicegate --help > /dev/null

USER sluicegate
WORKDIR /home/sluicegate

ENTRYPOINT ["sluicegate"]
CMD ["--help"]
