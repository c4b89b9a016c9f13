"""Flags and their resolution into a complete config."""

from __future__ import annotations

import pytest

from trainer.config import PRESETS, TrainConfig, help_text, parse_args, resolve


def test_help_lists_every_flag() -> None:
    text = help_text()
    for flag in ("--data", "--mixture", "--storage-options", "--steps", "--batch-size", "--seq-len",
                 "--layers", "--width", "--heads", "--lr", "--warmup-steps", "--weight-decay",
                 "--grad-clip", "--seed", "--num-workers", "--log-every", "--run-dir",
                 "--device", "--dtype", "--cache-dir", "--cache-bytes", "plot RUN_DIR"):
        assert flag in text, flag


def test_parse_and_resolve_on_cpu() -> None:
    cfg = parse_args(["--data", "s3://b/ds", "--steps", "50",
                      "--storage-options", '{"anon": true}'])
    assert cfg.storage_options == {"anon": True}
    assert cfg.num_workers == 0
    r = resolve(cfg, "cpu", bf16_supported=False)
    cpu = PRESETS["cpu"]
    assert (r.seq_len, r.batch_size, r.layers, r.width, r.heads) == (
        cpu["seq_len"], cpu["batch_size"], cpu["layers"], cpu["width"], cpu["heads"])
    assert r.seq_len == 128
    assert r.warmup_steps == 5
    assert r.dtype == "float32"


def test_cache_flags_take_sizes_with_units() -> None:
    cfg = parse_args(["--data", "d"])
    assert cfg.cache_dir is None and cfg.cache_bytes is None  # None: the loaders' default
    cfg = parse_args(["--data", "d", "--cache-dir", "/nvme/cache", "--cache-bytes", "1.5G"])
    assert cfg.cache_dir == "/nvme/cache" and cfg.cache_bytes == 3 << 29
    assert parse_args(["--data", "d", "--cache-bytes", "4096"]).cache_bytes == 4096
    assert parse_args(["--data", "d", "--cache-bytes", "200m"]).cache_bytes == 200 << 20


def test_explicit_flags_win_over_presets() -> None:
    cfg = parse_args(["--data", "d", "--seq-len", "64", "--width", "64", "--heads", "2",
                      "--warmup-steps", "0"])
    r = resolve(cfg, "cuda", bf16_supported=True)
    assert (r.seq_len, r.width, r.heads, r.warmup_steps) == (64, 64, 2, 0)
    assert r.layers == PRESETS["cuda"]["layers"]
    assert r.dtype == "bfloat16"


def test_bf16_only_on_cuda() -> None:
    with pytest.raises(ValueError, match="CUDA"):
        resolve(TrainConfig(data="d", dtype="bfloat16"), "cpu", bf16_supported=False)
    assert resolve(TrainConfig(data="d"), "cuda", bf16_supported=False).dtype == "float32"


def test_width_must_divide_by_heads() -> None:
    with pytest.raises(ValueError, match="divisible"):
        resolve(TrainConfig(data="d", width=65, heads=2), "cpu", bf16_supported=False)


@pytest.mark.parametrize("argv", [
    ["--data", "d", "--no-such-flag"],
    ["--data", "d", "--strategy", "zero"],
    ["--data", "d", "--no-compile"],  # no such negative: --compile is off by default
    ["--data", "d", "--storage-options", "not json"],
    ["--data", "d", "--storage-options", "[1, 2]"],
    ["--data", "d", "--steps", "0"],
    ["--data", "d", "--device", "tpu"],
    ["--steps", "3"],  # --data (or --mixture) is required
    [],
    ["--data", "d", "--mixture", "m.toml"],  # one or the other
    ["--data", "d", "--cache-bytes", "lots"],
    ["--data", "d", "--cache-bytes", "0"],
    ["--data", "d", "--readahead-bytes", "lots"],
])
def test_bad_flags_exit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parse_args(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "[1, 2]" not in err and "not json" not in err  # options values are never echoed


def test_user_errors_are_one_line_and_leave_no_run_dir(tmp_path, capsys) -> None:
    from trainer.cli import main

    run_dir = tmp_path / "run"
    assert main(["--data", str(tmp_path / "nope"), "--run-dir", str(run_dir)]) == 2
    assert "error: no dataset" in capsys.readouterr().err
    assert not run_dir.exists()
    assert main(["--data", str(tmp_path), "--device", "cpu", "--dtype", "bfloat16"]) == 2
    assert "CUDA" in capsys.readouterr().err


def test_presets_global_batch_and_grad_accum() -> None:
    from trainer.config import MODEL_PRESETS, ConfigError, resolve_batch

    cfg = resolve(parse_args(["--data", "d", "--preset", "gpt2-small", "--heads", "6",
                              "--global-batch-size", "24", "--grad-accum", "2"]),
                  "cpu", bf16_supported=False)
    assert (cfg.layers, cfg.width, cfg.heads) == (12, 768, 6)  # a flag beats the preset
    assert resolve_batch(cfg, 3).batch_size == 4  # 24 / (3 ranks x 2 micro-batches)
    assert resolve_batch(cfg, 1).batch_size == 12
    with pytest.raises(ConfigError, match="not divisible"):
        resolve_batch(cfg, 5)
    plain = resolve(parse_args(["--data", "d", "--batch-size", "4"]), "cpu", False)
    assert resolve_batch(plain, 2).global_batch_size == 8
    assert set(MODEL_PRESETS) == {"tiny", "gpt2-small", "1b"}


def test_new_flags_are_in_help() -> None:
    text = help_text()
    for flag in ("--checkpoint-dir", "--checkpoint-every", "--keep", "--resume",
                 "--async-checkpoint", "--global-batch-size", "--strategy", "--preset",
                 "--grad-accum", "--compile", "--deterministic"):
        assert flag in text, flag


def test_config_file_sets_flags_and_command_line_wins(tmp_path, capsys) -> None:
    path = tmp_path / "train.toml"
    path.write_text('data = "data/x"\nsteps = 7\ncheckpoint-every = 3\n')
    cfg = parse_args(["--config", str(path), "--steps", "9"])
    assert (cfg.data, cfg.steps, cfg.checkpoint_every) == ("data/x", 9, 3)
    path.write_text("stepz = 1\n")
    with pytest.raises(SystemExit) as caught:
        parse_args(["--config", str(path), "--data", "d"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "unknown key 'stepz'" in err and "steps" in err


@pytest.mark.parametrize("suffix", [".toml", ".yaml", ".json"])
def test_precedence_flags_file_environment_defaults(tmp_path, monkeypatch, suffix) -> None:
    path = tmp_path / f"train{suffix}"
    path.write_text({".toml": 'data = "from-file"\nsteps = 7\ncheckpoint_storage_options = '
                              '{ anon = true }\n',
                     ".yaml": "data: from-file\nsteps: 7\ncheckpoint_storage_options: "
                              "{anon: true}\n",
                     ".json": '{"data": "from-file", "steps": 7, '
                              '"checkpoint-storage-options": {"anon": true}}'}[suffix])
    monkeypatch.setenv("SHARDFLOW_TRAINER_STEPS", "11")
    monkeypatch.setenv("SHARDFLOW_TRAINER_LR", "0.5")
    monkeypatch.setenv("SHARDFLOW_TRAINER_DATA", "from-env")
    default = TrainConfig(data="x")
    cfg = parse_args([])  # the environment over the defaults, --data from it too
    assert (cfg.data, cfg.steps, cfg.lr, cfg.seed) == ("from-env", 11, 0.5, default.seed)
    cfg = parse_args(["--config", str(path)])
    assert (cfg.data, cfg.steps, cfg.lr) == ("from-file", 7, 0.5)
    assert cfg.checkpoint_storage_options == {"anon": True}
    cfg = parse_args(["--config", str(path), "--steps", "9", "--data", "flag"])
    assert (cfg.data, cfg.steps, cfg.lr) == ("flag", 9, 0.5)


def test_a_mixture_file_instead_of_data(capsys) -> None:
    cfg = parse_args(["--mixture", "mix.toml", "--steps", "5"])
    assert (cfg.mixture, cfg.data, cfg.steps) == ("mix.toml", None, 5)
    for argv, message in (([], "give --data URL (a dataset) or --mixture FILE (several)"),
                          (["--data", "d", "--mixture", "m"], "not both")):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert message in capsys.readouterr().err


def test_defaults_are_stated_once(monkeypatch) -> None:
    monkeypatch.delenv("SHARDFLOW_STORAGE_OPTIONS", raising=False)
    assert parse_args(["--data", "d"]) == TrainConfig(data="d")
    monkeypatch.setenv("SHARDFLOW_STORAGE_OPTIONS", '{"anon": true}')
    assert parse_args(["--data", "d"]).storage_options == {"anon": True}
