"""``POST /api/v1/packages``: a job's working directory uploaded as a zip (raw body)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from tpufleet.api import auth
from tpufleet.api.deps import API, Db, Who
from tpufleet.api.errormap import responses
from tpufleet.errors import SpecError

__all__ = ["PackageOut", "UnsupportedMediaType", "router"]


class PackageOut(BaseModel):
    id: str = Field(description="sha256:<64 hex>: the working_dir of a job")
    size: int


class UnsupportedMediaType(SpecError):
    http_status = 415


router = APIRouter(prefix=API)


@router.post(
    "/packages",
    status_code=201,
    tags=["jobs"],
    response_model=PackageOut,
    responses=responses(400, 403, 404, 409, 413, 415, 422),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/zip": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def upload_package(
    me: Who,
    store: Db,
    request: Request,
    tenant: Annotated[
        str | None, Query(description="only with the admin token: the tenant it is for")
    ] = None,
) -> dict[str, Any]:
    """Upload a job's working directory as a zip (raw body, ``Content-Type: application/zip``),
    at most 100 MiB by default (``serve --max-package-bytes``), 20,000 entries, 1 GiB unpacked,
    no absolute paths, ``..`` or symbolic links, every entry's size and CRC-32 as declared. Answers
    its id, the ``working_dir`` of a job. A tenant's packages share its package quota (1 GiB by
    default, ``serve --package-quota-mib``; past it a 409); one no queued or running job names is
    deleted an hour after its upload or its last job's end."""
    owner = auth.submit_tenant(me, tenant)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/zip":
        raise UnsupportedMediaType(f"Content-Type must be application/zip, got {kind[:60]!r}")
    data = await request.body()
    package_id = await run_in_threadpool(store.packages.put, owner, data)
    return {"id": package_id, "size": len(data)}
