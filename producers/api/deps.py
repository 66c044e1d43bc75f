"""The routes' dependencies: the services the lifespan published on ``app.state``
(``producers.api.lifespan``), and the calling tenant.

Each is an ``async def`` (FastAPI runs a plain ``def`` dependency in a thread) and comes
with an ``Annotated`` alias for a route's signature.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from plumbing.settings import Settings
from producers.admission.controller import AdmissionController
from producers.api.pools import PoolRouter
from producers.api.waiting import Waiting
from producers.batches.lifecycle import Lifecycle as BatchLifecycle
from producers.batches.meter import Meter as BatchMeter
from producers.batches.repository import BatchStore
from producers.files.repository import FileStore
from producers.jobs.group_commit import GroupCommit
from producers.jobs.repository import JobRepository
from producers.lag.monitor import LagMonitor
from producers.overview.repository import OverviewStore
from producers.tenancy.keys import Caller, valid_tenant
from producers.tenancy.repository import KeyStore
from producers.webhooks.repository import WebhookStore
from schemas import constants
from schemas.errors import Unauthorized


async def settings(request: Request) -> Settings:
    found: Settings = request.app.state.settings
    return found


async def job_repository(request: Request) -> JobRepository:
    repo: JobRepository = request.app.state.repo
    return repo


async def group_commit(request: Request) -> GroupCommit:
    groups: GroupCommit = request.app.state.group_commit
    return groups


async def admission(request: Request) -> AdmissionController:
    controller: AdmissionController = request.app.state.admission
    return controller


async def pool_router(request: Request) -> PoolRouter:
    router: PoolRouter = request.app.state.pools
    return router


async def lag_monitor(request: Request) -> LagMonitor:
    monitor: LagMonitor = request.app.state.monitor
    return monitor


async def waiting(request: Request) -> Waiting:
    state = request.app.state
    return Waiting(repo=state.repo, waiters=state.waiters, reads=state.reads)


async def batch_store(request: Request) -> BatchStore:
    store: BatchStore = request.app.state.batches
    return store


async def batch_meter(request: Request) -> BatchMeter:
    meter: BatchMeter = request.app.state.meter
    return meter


async def batch_lifecycle(request: Request) -> BatchLifecycle:
    lifecycle: BatchLifecycle = request.app.state.lifecycle
    return lifecycle


async def file_store(request: Request) -> FileStore:
    store: FileStore = request.app.state.files
    return store


async def webhook_store(repo: Annotated[JobRepository, Depends(job_repository)]) -> WebhookStore:
    return WebhookStore(repo.engine)


async def overview_store(
    repo: Annotated[JobRepository, Depends(job_repository)],
) -> OverviewStore:
    return OverviewStore(repo.engine)


async def key_store(request: Request) -> KeyStore:
    keys: KeyStore = request.app.state.keys
    return keys


AppSettings = Annotated[Settings, Depends(settings)]
Jobs = Annotated[JobRepository, Depends(job_repository)]
Groups = Annotated[GroupCommit, Depends(group_commit)]
Admission = Annotated[AdmissionController, Depends(admission)]
Pools = Annotated[PoolRouter, Depends(pool_router)]
Monitor = Annotated[LagMonitor, Depends(lag_monitor)]
Waits = Annotated[Waiting, Depends(waiting)]
Batches = Annotated[BatchStore, Depends(batch_store)]
Files = Annotated[FileStore, Depends(file_store)]
Meter = Annotated[BatchMeter, Depends(batch_meter)]
Lifecycle = Annotated[BatchLifecycle, Depends(batch_lifecycle)]
Webhooks = Annotated[WebhookStore, Depends(webhook_store)]
Keys = Annotated[KeyStore, Depends(key_store)]
Overviews = Annotated[OverviewStore, Depends(overview_store)]


async def current_caller(
    config: AppSettings,
    keys: Keys,
    authorization: Annotated[
        str | None, Header(description="Bearer <API key> (auth = api_key)")
    ] = None,
    tenant: Annotated[
        str | None,
        Header(
            alias=constants.HEADER_TENANT,
            description="The tenant, trusted only with auth = tenant_header",
        ),
    ] = None,
) -> Caller:
    """The caller, by the deployment's ``auth`` setting: its tenant, and whether its key is
    an operator's (never with ``tenant_header``)."""
    if config.auth == "tenant_header":
        return Caller(tenant=valid_tenant(tenant or constants.DEFAULT_TENANT))
    scheme, _, key = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not key:
        raise Unauthorized("send Authorization: Bearer <API key>")
    caller = await keys.caller_of(key.strip())
    if caller is None:
        raise Unauthorized("unknown or revoked API key")
    return caller


# The caller, for a route that lets an operator key see every tenant.
CallerOf = Annotated[Caller, Depends(current_caller)]


async def current_tenant(caller: CallerOf) -> str:
    return caller.tenant


# The calling tenant, for a route's signature: every query a route makes is scoped to it.
Tenant = Annotated[str, Depends(current_tenant)]
