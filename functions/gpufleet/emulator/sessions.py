"""The boto3 sessions of the embedded account: handed to the control plane's clients through
`runtime.use_sessions`, and used by the emulator's own.

Each is a new session (sessions are not thread-safe), but all share one loader of the service
models: a new session would parse the models' JSON again (about 0.3 s a client), and the
emulator, its nodes and every handler's cold start make clients by the hundred. The models are
only read, so sharing them changes nothing but CPU.
"""

from __future__ import annotations

import threading

import boto3
import botocore.loaders
import botocore.session


class SessionsSharingModels:
    def __init__(self) -> None:
        self._loader = botocore.loaders.create_loader()
        self._lock = threading.Lock()

    def __call__(self) -> boto3.session.Session:
        core = botocore.session.Session()
        core.register_component("data_loader", self._loader)
        with self._lock:
            session = boto3.session.Session(botocore_session=core)
            # Each boto3 session adds its own models' path to the loader: once is enough.
            paths = self._loader.search_paths
            if paths.count(paths[-1]) > 1:
                paths.pop()
        return session
