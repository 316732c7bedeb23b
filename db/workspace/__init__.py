"""What a person arranges on the pages and keeps across browser sessions: the Run page's panel
layout (:mod:`db.workspace.layouts`)."""
