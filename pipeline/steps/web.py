"""The web steps as steps: URL block-list, HTML to main text, language ID, PII masking
(FineWeb's order, with the cleaner between extraction and language ID). Their drop reasons
and change counts keep the names they had (``url_blocked``, ``not_html``, ``language``,
``pii_emails_masked``, ...): manifests and dashboards compare across versions."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Annotated, Any

from cyclopts import Parameter

from infra.config import OptionalCommaList, comma_list
from pipeline.config_field import flag
from pipeline.steps.contract import Doc, Poisoned

#: quarantine reason of a page refused by the complexity check
TOO_COMPLEX = "extract_too_complex"


@dataclass
class LanguageFlags:
    """The ``langid`` step's options as ``pipeline run`` flags."""

    languages: Annotated[OptionalCommaList, Parameter(metavar="CODES")] = flag(
        None, "keep only documents in these languages (ISO 639-1, comma-separated, e.g. "
        "'en,de'), identified with py3langid's bundled model; default: keep all",
        manifest=False)
    min_lang_score: float = flag(0.65, "with --languages: drop documents whose language "
                                 "probability is below this (lang_score)", manifest=False)

    def check_language_flags(self) -> None:
        """``languages="en,de"`` given in Python takes the flag's grammar."""
        if self.languages is not None:
            self.languages = comma_list(self.languages)


@dataclass
class UrlBlocklistFlags:
    """The ``url_blocklist`` step's option as a ``pipeline run`` flag."""

    url_blocklist: Annotated[str | None, Parameter(metavar="FILE")] = flag(
        None, "drop documents whose URL's domain (or a parent domain) or whole URL is listed "
        "in FILE (local or any fsspec URL), one per line (url_blocked)", manifest=False)


@dataclass
class PiiFlags:
    """The ``pii`` step as a ``pipeline run`` flag."""

    pii: str = flag("none", "'mask': replace e-mail addresses and public IP addresses with "
                    "stand-ins (counted); 'none'", manifest=False)

    def check_pii(self) -> None:
        if self.pii not in ("none", "mask"):
            raise ValueError(f"pii must be 'mask' or 'none', not {self.pii!r}")


class UrlBlocklist:
    """Drop documents whose URL's host (or a parent domain of it) or whole URL is listed in
    ``path`` (a text file, local or any fsspec URL: one domain or URL per line)."""

    name = "url_blocklist"
    version = "1"
    qualified_reasons = True
    wants_storage_options = True

    def __init__(self, path: str, storage_options: dict[str, Any] | None = None) -> None:
        from pipeline.web.urls import load_blocklist

        self.path = path
        self.blocklist = load_blocklist(path, storage_options)

    def __call__(self, doc: Doc) -> Doc | tuple[None, str]:
        from pipeline.web.urls import blocked

        if self.blocklist and blocked(doc.meta["url"], self.blocklist):
            return None, "url_blocked"
        return doc


class Extract:
    """HTML pages to their main text (resiliparse); text records pass as they are, other
    content types (PDF, images) are dropped as ``not_html``. A page nested too deeply to
    extract in bounded time is quarantined (``extract_too_complex``) before it is parsed."""

    name = "extract"
    version = "1"
    qualified_reasons = True

    def __init__(self) -> None:
        self.changed: Counter[str] = Counter()

    def warm_up(self) -> None:
        """Load the parser once per process, so the first record's CPU time is its own."""
        from pipeline.web.extract import html_to_text

        html_to_text("<html><body><p>Warming up the parser.</p></body></html>")

    def __call__(self, doc: Doc) -> Doc | tuple[None, str]:
        kind = doc.meta["kind"]
        if kind.startswith("other"):
            return None, "not_html"
        if kind != "html":
            return doc
        from pipeline.web.extract import html_to_text, refusal

        why = refusal(doc.text)
        if why is not None:
            raise Poisoned(TOO_COMPLEX, why)
        try:
            text = html_to_text(doc.text)
        except Exception:  # a page the parser cannot take: counted, never fatal
            return None, "extract_failed"
        if not text:
            return None, "extract_empty"
        self.changed["extracted"] += 1
        doc.text = text
        return doc

    def close(self) -> None:
        from pipeline.web.extract import forget

        forget()


class LanguageId:
    """Identify each document's language (py3langid: ``lang`` and ``lang_score`` in its
    metadata); with ``languages``, drop the others (``language``) and those identified with
    less than ``min_score`` (``lang_score``). ``annotate``: write ``lang`` and ``score`` as
    signals and drop nothing."""

    name = "langid"
    version = "1"
    qualified_reasons = True
    modes = ("filter", "annotate")

    def __init__(self, languages: list[str] | tuple[str, ...] = (), min_score: float = 0.65,
                 mode: str = "filter") -> None:
        from pipeline.web.langid import check_languages

        self.languages = frozenset(check_languages(tuple(c.lower() for c in languages)))
        self.min_score = float(min_score)
        self.annotate = mode == "annotate"
        #: annotate mode only: filter mode keeps the language in the metadata columns
        self.signals: dict[str, type] = {"lang": str, "score": float} if self.annotate else {}

    def warm_up(self) -> None:
        from pipeline.web.langid import identify

        identify("Warming up the language model.")

    def __call__(self, doc: Doc) -> Doc | tuple[None, str]:
        from pipeline.web.langid import identify

        lang, score = identify(doc.text)
        doc.set_meta("lang", lang)
        doc.set_meta("lang_score", score)
        if self.annotate:
            doc.signals["lang"] = lang
            doc.signals["score"] = float(score)
        elif self.languages:
            if lang not in self.languages:
                return None, "language"
            if score < self.min_score:
                return None, "lang_score"
        return doc


class PiiMask:
    """Mask e-mail addresses and public IP addresses (stand-ins that are not public)."""

    name = "pii"
    version = "1"
    qualified_reasons = True

    def __init__(self) -> None:
        self.changed: Counter[str] = Counter()

    def __call__(self, doc: Doc) -> Doc:
        from pipeline.web.pii import mask

        text, n_email, n_ip = mask(doc.text)
        if n_email:
            self.changed["pii_emails_masked"] += n_email
        if n_ip:
            self.changed["pii_ips_masked"] += n_ip
        doc.text = text
        return doc
