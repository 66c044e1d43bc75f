"""The webhook routes: the caller's deliveries (dead letters included) with their attempts,
and its signing secrets. Everything is scoped to the caller's tenant; another tenant's
delivery or secret answers 404 as if it did not exist."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from producers.api import openapi
from producers.api.deps import Tenant, Webhooks
from schemas.webhooks import (
    DeliveryDetail,
    DeliveryList,
    DeliveryState,
    ExpireSecret,
    NewSecret,
    SecretList,
    SecretView,
)

DEFAULT_PAGE = 100
MAX_PAGE = 1000

_ERRORS = openapi.errors(400, 401, 404, 408, 413, 422, 503)

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"], responses=_ERRORS)


@router.get("/deliveries", response_model=DeliveryList, summary="List webhook deliveries")
async def list_deliveries(
    store: Webhooks,
    tenant: Tenant,
    state: Annotated[DeliveryState | None, Query(description="dead: the dead letters")] = None,
    subject: Annotated[str | None, Query(max_length=64, description="a job or batch id")] = None,
    after: Annotated[str | None, Query(max_length=64, description="next_after of a page")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
) -> DeliveryList:
    """The caller's webhook deliveries, oldest first."""
    page, more = await store.deliveries(
        tenant, state=state, subject=subject, after=after, limit=limit
    )
    return DeliveryList(data=page, next_after=page[-1].id if more else None)


@router.get(
    "/deliveries/{delivery_id}", response_model=DeliveryDetail, summary="Read a webhook delivery"
)
async def get_delivery(delivery_id: str, store: Webhooks, tenant: Tenant) -> DeliveryDetail:
    """One delivery: its payload, every attempt, and why it was dead-lettered."""
    return await store.delivery(tenant, delivery_id)


@router.post(
    "/deliveries/{delivery_id}/redeliver",
    response_model=DeliveryDetail,
    responses=openapi.errors(409),
    summary="Redeliver a dead webhook delivery",
)
async def redeliver(delivery_id: str, store: Webhooks, tenant: Tenant) -> DeliveryDetail:
    """Send a dead (dead-lettered) delivery again, now: the same message (its webhook-id
    and body, so the receiver can dedupe it), as one more attempt; if that fails it is dead
    again. 409 ``delivery_not_dead`` while it is pending or once it was delivered."""
    return await store.redeliver(tenant, delivery_id)


@router.post(
    "/secrets", response_model=NewSecret, status_code=201, summary="Create a signing secret"
)
async def create_secret(store: Webhooks, tenant: Tenant) -> NewSecret:
    """A new signing secret. This answer is the only time the secret is shown. From now
    on every webhook of the tenant is signed with it too (one signature per unexpired
    secret)."""
    return await store.create_secret(tenant)


@router.get("/secrets", response_model=SecretList, summary="List signing secrets")
async def list_secrets(store: Webhooks, tenant: Tenant) -> SecretList:
    """The tenant's secrets, without the secrets themselves."""
    return SecretList(data=await store.list_secrets(tenant))


@router.post(
    "/secrets/{secret_id}/expire", response_model=SecretView, summary="Expire a signing secret"
)
async def expire_secret(
    secret_id: Annotated[int, Path(ge=1, le=2**63 - 1)],
    store: Webhooks,
    tenant: Tenant,
    body: ExpireSecret | None = None,
) -> SecretView:
    """Stop signing with the secret, now or after ``in_s`` seconds of grace."""
    in_s = body.in_s if body is not None else 0.0
    return await store.expire_secret(tenant, secret_id, in_s)
