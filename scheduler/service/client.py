"""The Python client for the gpupack service: one method per declared operation (:mod:`scheduler.service.ops`),
each returning the service's JSON.

    from scheduler.service.client import Client
    c = Client()                                     # GPUPACK_URL / GPUPACK_TOKEN, or the local state folder's token
    slot = c.request_slot(gpu_memory="12GB", cpus=2, minutes=20)
    job = c.submit_job(slot["slot_id"], ["python", "train.py"])
    print(c.job_status(job["job_id"])["advice"])
    c.job_status(job["job_id"])["status"]            # running, then finished | failed | cancelled | deadline

Job answers are in the run schema's words (``docs/run.schema.json``'s ``SlotJobView``): ``state`` a task's word,
``status`` a run's, ``finished`` the end (``ended``: deprecated alias), paths absolute.
"""

from __future__ import annotations

import inspect
import os
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx

from scheduler.service.ops import OPS, Op
from scheduler.service.validate import ServiceError  # the one error class: a refusal, with its status

DEFAULT_URL = "http://127.0.0.1:8780"




def find_token(token: str | None = None, state_dir: str | Path | None = None) -> str | None:
    """``token``, else env GPUPACK_TOKEN, else the token file in the state folder (``--state`` or GPUPACK_STATE or
    ~/.gpupack/service)."""
    if token:
        return token
    if os.environ.get("GPUPACK_TOKEN"):
        return os.environ["GPUPACK_TOKEN"]
    folder = Path(state_dir or os.environ.get("GPUPACK_STATE", "~/.gpupack/service")).expanduser()
    try:
        return (folder / "token").read_text().strip() or None
    except OSError:
        return None


def _error_of(r: httpx.Response) -> str:
    """The one-line reason in an error answer (``{"error": …}``), whatever the answer holds."""
    try:
        data = r.json()
    except ValueError:
        return r.text.strip()[:500] or r.reason_phrase
    return str(data.get("error", data)) if isinstance(data, dict) else str(data)


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0,
                 state_dir: str | Path | None = None, transport: httpx.BaseTransport | None = None):
        self.url = (url or os.environ.get("GPUPACK_URL") or DEFAULT_URL).rstrip("/")
        self.token = find_token(token, state_dir)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw) -> Any:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.HTTPError as e:
            raise ServiceError.answered(0, f"cannot reach the gpupack service at {self.url} ({e}); is `serve` running?") from None
        if r.status_code >= 400:
            raise ServiceError.answered(r.status_code, _error_of(r))
        try:
            return r.json()
        except ValueError:
            raise ServiceError.answered(r.status_code, f"the service answered something that is not JSON: {r.text[:200]!r}") from None

    def _op(self, op: Op, values: dict) -> Any:
        """A declared operation: path parameters into the path, query ones as the query, the rest as the JSON body
        (None left out). An operation with a ``retry_key`` is retried when its answer is lost: the key (made here
        when none is given) makes the retry the same request, so a network failure never takes two slots."""
        if op.retry_key and values.get(op.retry_key) is None:
            values[op.retry_key] = uuid.uuid4().hex
        path = op.path.format(**{p.name: values[p.name] for p in op.params if p.where == "path"})
        kw: dict = {}
        query = {p.name: values[p.name] for p in op.params if p.where == "query" and values[p.name] is not None}
        if query:
            kw["params"] = query
        if any(p.where == "body" for p in op.params):
            kw["json"] = {p.name: values[p.name] for p in op.params
                          if p.where == "body" and values[p.name] is not None}
        for attempt in range(3 if op.retry_key else 1):
            try:
                return self._call(op.method, path, **kw)
            except ServiceError as e:
                if e.status != 0 or attempt == 2 or not op.retry_key:
                    raise
        raise AssertionError("unreachable")

    def follow_logs(self, job_id: str, tail: int = 100) -> Iterator[str]:
        """The log's text as it grows, until the job ends."""
        try:
            with self._http.stream("GET", f"/api/jobs/{job_id}/logs", params={"tail": tail, "follow": "true"},
                                   timeout=None) as r:
                if r.status_code >= 400:
                    r.read()
                    raise ServiceError.answered(r.status_code, _error_of(r))
                yield from r.iter_text()
        except httpx.HTTPError as e:
            raise ServiceError.answered(0, f"cannot reach the gpupack service at {self.url} ({e}); is `serve` running?") from None



def _method(op: Op):
    """The client's method for a declared operation, with the declared signature."""
    sig = op.signature("client", [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)], dict)

    def method(self, *args, **kwargs) -> dict:
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        del values["self"]
        return self._op(op, values)

    method.__signature__ = sig
    method.__name__, method.__qualname__, method.__doc__ = op.name, f"Client.{op.name}", op.doc
    return method


for _op in OPS:
    setattr(Client, _op.name, _method(_op))
