# quotaledger: the package installed the way README.md does it (`pip install .`).
FROM python:3.11-slim

WORKDIR /src
COPY pyproject.toml README.md ./
COPY events events
COPY projections projections
COPY engine engine
COPY adapters adapters
COPY examples examples
RUN pip install --no-cache-dir . && useradd --system --home /var/lib/quotaledger quotaledger \
    && mkdir -p /var/lib/quotaledger && chown quotaledger /var/lib/quotaledger

USER quotaledger
WORKDIR /var/lib/quotaledger
EXPOSE 8080
ENTRYPOINT ["quotaledger"]
CMD ["--help"]
