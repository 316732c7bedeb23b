"""The floor of a Streamlit page here: a bare page served the way runyard's UI serves its own.

    .venv/bin/python bench/streamlit_floor.py --port 8599     # serves until SIGTERM

Streamlit's ASGI app (``st.App``) over bench/streamlit_floor_page.py, with the Streamlit options
and the uvicorn settings of app/server/asgi.py, and nothing in front (no gate, no database). The page
draws a title and one Altair line chart of ``ranks x points`` rows, the size of the Run page's
first curve (8 ranks x 1,000 buckets: app/panels/metrics.py's CHART_ROWS). bench_render.py starts it
beside runyard's UI and times both in the same browser, taking turns: what any Streamlit page
with one chart costs on this machine, against what runyard's Run page costs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from app.server.asgi import bind, streamlit_app, uvicorn_server  # noqa: E402 - needs ROOT on sys.path

PAGE = Path(__file__).with_name("streamlit_floor_page.py")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = streamlit_app(PAGE)  # the UI's own set-up, without the gate in front
    sock = bind("127.0.0.1", args.port)
    print(f"floor page on http://127.0.0.1:{args.port}/", flush=True)
    uvicorn_server(app).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
