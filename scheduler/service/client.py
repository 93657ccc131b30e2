"""The Python client for the gpupack service: one method per service call, each returning the service's JSON.

    from scheduler.service.client import Client
    c = Client()                                     # GPUPACK_URL / GPUPACK_TOKEN, or the local state folder's token
    slot = c.request_slot(gpu_memory="12GB", cpus=2, minutes=20)
    job = c.submit_job(slot["slot_id"], ["python", "train.py"])
    print(c.job_status(job["job_id"])["advice"])
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx

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

    # -- slots --

    def request_slot(self, gpu_memory: str | None = None, cpus: int = 1, minutes: float = 30, priority: int = 0,
                     label: str = "", model: str | None = None, image_size: int | None = None,
                     batch_size: int | None = None, heartbeat_s: float | None = None,
                     client_request_id: str | None = None) -> dict:
        """A lease or a queued request. A fresh ``client_request_id`` is made when none is given, and a retry of a
        lost answer reuses it, so a network failure never takes two slots."""
        body = {k: v for k, v in dict(gpu_memory=gpu_memory, cpus=cpus, minutes=minutes, priority=priority,
                                      label=label, model=model, image_size=image_size, batch_size=batch_size,
                                      heartbeat_s=heartbeat_s,
                                      client_request_id=client_request_id or uuid.uuid4().hex).items()
                if v is not None}
        for attempt in range(3):
            try:
                return self._call("POST", "/api/slots", json=body)
            except ServiceError as e:
                if e.status != 0 or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def get_slot(self, slot_id: str) -> dict:
        return self._call("GET", f"/api/slots/{slot_id}")

    def renew(self, slot_id: str) -> dict:
        return self._call("POST", f"/api/slots/{slot_id}/renew")

    def release(self, slot_id: str) -> dict:
        return self._call("DELETE", f"/api/slots/{slot_id}")

    def list_slots(self) -> dict:
        return self._call("GET", "/api/slots")

    # -- jobs --

    def submit_job(self, slot_id: str, argv: list[str], cwd: str | None = None, env: dict | None = None) -> dict:
        body = {"slot_id": slot_id, "argv": list(argv)}
        if cwd is not None:
            body["cwd"] = cwd
        if env:
            body["env"] = env
        return self._call("POST", "/api/jobs", json=body)

    def job_status(self, job_id: str) -> dict:
        return self._call("GET", f"/api/jobs/{job_id}")

    def job_logs(self, job_id: str, tail: int = 100, offset: int | None = None) -> dict:
        params: dict = {"tail": tail}
        if offset is not None:
            params["offset"] = offset
        return self._call("GET", f"/api/jobs/{job_id}/logs", params=params)

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

    def cancel_job(self, job_id: str) -> dict:
        return self._call("POST", f"/api/jobs/{job_id}/stop")

    def gpu_status(self) -> dict:
        return self._call("GET", "/api/gpus")

    def create_token(self, name: str) -> dict:
        return self._call("POST", "/api/tokens", json={"name": name})

    def health(self) -> dict:
        return self._call("GET", "/api/health")
