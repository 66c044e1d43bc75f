# One image for every Sluicegate role; build with --build-arg EXTRAS=vllm for GPU workers.
FROM python:3.11-slim

ARG EXTRAS=""
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY producers ./producers
COPY workers ./workers
COPY sluicegate ./sluicegate
COPY migrations ./migrations
RUN pip install ".${EXTRAS:+[$EXTRAS]}" \
    && useradd --create-home --uid 10001 sluicegate
USER sluicegate

ENTRYPOINT ["sluicegate"]
CMD ["--help"]
