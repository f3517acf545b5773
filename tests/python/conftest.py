"""What the pytest-driven Python tests share: `scratch`, the test's own
scratch folder. A test script's main() names it in $ZINF_TEST_SCRATCH from
its first argument (as ctest passes it); run by pytest directly, it is a
folder in the temporary directory named after the module."""
import os
import tempfile

import pytest


@pytest.fixture
def scratch(request):
    path = os.environ.get("ZINF_TEST_SCRATCH") or os.path.join(tempfile.gettempdir(),
                                                               "zinf-" + request.module.__name__)
    os.makedirs(path, exist_ok=True)
    return path
