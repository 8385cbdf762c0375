"""What every config section is: frozen, no key it does not know, no inf or nan, no true or false for a number."""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

# A second longer than a day has no place in a night; past it, sleeps and dates overflow.
DAY_S = 86400.0


class Section(BaseModel):
    # inf and nan would pass every bound a section sets, then overflow the first timedelta made of them.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1: `max_tokens_per_night = true` would be a 1-token budget.
        # Numeric strings and whole floats stay accepted, as they always were.
        annotation = cls.model_fields[info.field_name].annotation if info.field_name else None
        if isinstance(value, bool) and {annotation, *get_args(annotation)} & {int, float}:
            raise ValueError(f"must be a number, not {str(value).lower()}")
        return value
