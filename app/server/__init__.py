"""The UI's server side, in front of Streamlit and apart from the pages.

- ``asgi``: the UI server's process (``python -m app.server.asgi``): its options, its socket, and
  Streamlit's ASGI app wrapped in the gate, served by uvicorn;
- ``gate``: Host, Origin and the session cookie checked before Streamlit sees a request;
- ``access``: the request rules the gate applies (session cookie, Host, Origin, proxy headers,
  login rate limit);
- ``prometheus``: ``GET /metrics``, in front of the gate, with its own scrape token.

Nothing here imports the pages' modules: the server loads app/main.py by its path.
"""
