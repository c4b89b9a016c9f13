"""The web test dataset views are made from: WET records in four languages through the real
job (annotated by the Gopher rules, small row groups so shards hold several), beside which a
test writes its views. Shared by the select, loader and gc tests of views."""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

import pytest

from pipeline.config import PipelineConfig
from pipeline.driver.job import run
from tests.pipeline.web import warcs

TEXTS = {
    "en": ("The committee met on {i} occasions this year to review the budget, and the members "
           "agreed that the library should stay open longer in the evenings. Several residents "
           "asked for more children's books, better lighting in the reading room and a quieter "
           "space for students preparing their examinations during the winter."),
    "de": ("Der Ausschuss hat sich in diesem Jahr {i} Mal getroffen, um den Haushalt zu "
           "prüfen, und die Mitglieder waren sich einig, dass die Bibliothek abends länger "
           "geöffnet bleiben sollte. Mehrere Bewohner wünschten sich mehr Kinderbücher, "
           "besseres Licht im Lesesaal und einen ruhigeren Raum für Studenten."),
    "fr": ("Le comité s'est réuni {i} fois cette année pour examiner le budget, et les membres "
           "ont convenu que la bibliothèque devrait rester ouverte plus tard le soir. Plusieurs "
           "habitants ont demandé davantage de livres pour enfants, un meilleur éclairage dans "
           "la salle de lecture et un espace plus calme pour les étudiants."),
    "es": ("El comité se reunió {i} veces este año para revisar el presupuesto, y los miembros "
           "acordaron que la biblioteca debería permanecer abierta más tarde por las noches. "
           "Varios vecinos pidieron más libros infantiles, mejor iluminación en la sala de "
           "lectura y un espacio más tranquilo para los estudiantes."),
}


def build(root: Path, docs_per_language: int = 30,
          shared: pytest.TempPathFactory | None = None) -> Path:
    """``root/web``: a dataset of ``4 * docs_per_language`` documents (about half of them
    English, then German, French, Spanish), in 3 shards of several row groups each.

    ``shared``: the session's temporary-path factory: the dataset (and its ``crawl/``) is
    then built once per test session, under a lock beside every xdist worker's base folder,
    and copied into ``root``: four test files use it, and each run of the job took 10-17 s.
    The copy's manifest names the first build's input paths; ``rebuild`` reads ``root``'s."""
    if shared is None:
        return _build(root, docs_per_language)
    base = shared.getbasetemp()
    cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / \
        f"web-views-{docs_per_language}"
    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{cache}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (cache / "web" / "manifest.json").exists():
            shutil.rmtree(cache, ignore_errors=True)
            _build(cache, docs_per_language)
    shutil.copytree(cache / "crawl", root / "crawl", dirs_exist_ok=True)
    shutil.copytree(cache / "web", root / "web")
    return root / "web"


def _build(root: Path, docs_per_language: int) -> Path:
    crawl = root / "crawl"
    crawl.mkdir(parents=True, exist_ok=True)
    langs = ["en", "en", "de", "fr", "es", "en"]  # en: half the documents
    n = 4 * docs_per_language
    for part in range(3):
        records = []
        for i in range(part, n, 3):
            lang = langs[i % len(langs)]
            body = " ".join(TEXTS[lang].format(i=i + k) for k in range(1 + i % 4))
            records.append(warcs.conversion(f"https://{lang}.example/{i}", body))
        warcs.write(crawl / f"part-{part}.warc.wet.gz", records)
    return rebuild(root, [str(crawl / "*.gz")])


def rebuild(root: Path, inputs: list[str] | None = None) -> Path:
    """Run the job into ``root/web`` again (default: without the third WET file, so the new
    version drops a shard the first one has)."""
    out = root / "web"
    inputs = inputs or [str(root / "crawl" / f"part-{i}.warc.wet.gz") for i in (0, 1)]
    run(PipelineConfig(inputs=inputs, output=str(out), workers=1,
                       dashboard_address="127.0.0.1:0", annotate="gopher",
                       files_per_partition=1, row_group_tokens=512), progress=False)
    return out
