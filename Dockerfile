# runyard on a CUDA base image whose torch build satisfies torch>=2.4,<3 (kept as is).
#   docker build -t runyard .
#   docker run --gpus all -p 127.0.0.1:8501:8501 -v runyard-data:/data runyard
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    RUNYARD_HOME=/data

WORKDIR /opt/runyard
COPY pyproject.toml README.md runyard.py ./
COPY app ./app
COPY orchestrator ./orchestrator
COPY trainer ./trainer
COPY db ./db
COPY examples ./examples
# postgres: psycopg 3, so that RUNYARD_DB_URL=postgresql+psycopg://... works in the image
# (docs/OPERATIONS.md, "PostgreSQL").
RUN pip install ".[gpu,scripts,postgres]" && python -c "import torch; print('torch', torch.__version__)"

VOLUME ["/data"]
EXPOSE 8501
# Inside the container 0.0.0.0 is needed for the published port to reach the UI; the access
# token (printed in `docker logs`, kept in /data/token) is then the only thing between that port
# and a shell in the container: publish it on the host's loopback (-p 127.0.0.1:8501:8501).
HEALTHCHECK --interval=30s --timeout=5s CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8501/healthz', timeout=4)"]
CMD ["runyard", "up", "--host", "0.0.0.0", "--port", "8501"]
