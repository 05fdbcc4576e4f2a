from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.agent.support import validate


@pytest.fixture
def schema_validate() -> Callable[[Any, str], None]:
    return validate
