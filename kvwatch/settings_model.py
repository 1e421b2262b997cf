"""The pydantic-settings model of ``WatchSettings``, for what kvwatch.settings does not read itself.

Built from the fields of :class:`kvwatch.settings.WatchSettings` (one list of fields), imported
only when a flag or a ``KVWATCH_*`` variable is not plain: pydantic's lax parsing and its messages
then decide, as they did when the settings were this model alone.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from pydantic import AliasChoices, BaseModel, Field, ValidationError, create_model, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kvwatch.errors import UsageError
from kvwatch.settings import ENV_PREFIX, FIELDS, WatchSettings, check_listen, check_one_source_each, field_type


class _Base(BaseSettings):
    # protected_namespaces=(): "model" here is the LLM, not pydantic's model_* namespace.
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", frozen=True, populate_by_name=True, protected_namespaces=()
    )


def _listen(cls: type[BaseModel], value: str) -> str:
    return check_listen(value)


def _one_source_each(self: BaseModel) -> BaseModel:
    check_one_source_each(self)
    return self


@functools.cache
def settings_model() -> type[BaseSettings]:
    """The pydantic-settings class of WatchSettings' fields, bounds, aliases and checks."""
    fields: dict[str, Any] = {}
    for f in FIELDS:
        kind: Any = field_type(f)
        annotation = kind | None if "None" in str(f.type) else kind
        meta = f.metadata
        extra: dict[str, Any] = {"validation_alias": AliasChoices(*meta["aliases"])} if meta["aliases"] else {}
        fields[f.name] = (
            annotation,
            Field(f.default, description=meta["description"], gt=meta["gt"], le=meta["le"], repr=f.repr, **extra),
        )
    validators: dict[str, Any] = {
        "_listen_is_host_port": field_validator("listen")(classmethod(_listen)),
        "_one_model_source": model_validator(mode="after")(_one_source_each),
    }
    model: type[BaseSettings] = create_model("WatchSettingsModel", __base__=_Base, __validators__=validators, **fields)
    return model


def validated(flags: Mapping[str, Any]) -> WatchSettings:
    """The settings as pydantic-settings reads ``flags`` over ``KVWATCH_*`` variables over the defaults.

    Raises UsageError naming the first setting pydantic refused and why.
    """
    try:
        read = settings_model()(**flags)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "settings"
        raise UsageError(f"{where}: {first.get('msg', 'invalid')}".replace("Value error, ", "")) from None
    return WatchSettings(**{f.name: getattr(read, f.name) for f in FIELDS})
