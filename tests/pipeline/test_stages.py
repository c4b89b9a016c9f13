"""What a pipeline task carries must not show credentials when Dask logs it."""

from __future__ import annotations

from pipeline.cleaning import CleaningConfig
from pipeline.readers import ReadOptions
from pipeline.stages import HiddenOptions, StageParams

SECRET = "wJalrXUtnFEMI-not-a-real-key"


def test_task_arguments_keep_storage_options_out_of_their_repr() -> None:
    options = {"key": "AKIDEXAMPLE", "secret": SECRET}
    params = StageParams(ReadOptions(), CleaningConfig(), True, False, (128, 16, 5), "0" * 64,
                         50257, 50256, 1024, 256 * 1024, False, options)
    hidden = HiddenOptions(options)
    for text in (repr(params), str(params), repr(hidden), repr((1, hidden, params))):
        assert SECRET not in text and "AKIDEXAMPLE" not in text
    assert params.storage_options == options and hidden.value == options  # still delivered
