"""The web steps on single documents (the chain of the recipe the web flags describe): each
step's counts and reasons, PII, the block-list, the rule-set and option parsing, the config's
flags."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.cleaning import CleaningConfig
from pipeline.config import PipelineConfig
from pipeline.records import Document
from pipeline.steps.chain import StepChain
from pipeline.steps.shorthand import recipe_of
from pipeline.web import WebConfig, parse_filter_options, parse_filters
from pipeline.web.pii import mask
from pipeline.web.urls import blocked, parse_blocklist

PROSE = ("The committee met on Tuesday to review the plan. It was agreed that the budget "
         "would have to be cut, and that the work of the group should continue with the "
         "same people. Several members asked to be kept informed of the results.\n"
         "A second meeting is planned for the spring. The chair said that the decision was "
         "difficult and thanked everyone for their patience with the long process.\n"
         "Questions about the new schedule can be sent to the office. The minutes will be "
         "published next week, together with the list of actions and their owners.")


def html(body: str) -> str:
    return f"<html><head><title>t</title></head><body><nav>Home | About</nav><main>{body}" \
           "</main><footer>Copyright</footer></body></html>"


class WebSteps:
    """The chain of the recipe a :class:`WebConfig` describes, with the metadata columns of
    the documents kept."""

    def __init__(self, web: WebConfig) -> None:
        self.chain = StepChain(recipe_of(CleaningConfig(), web))
        self.columns = self.chain.columns()

    def __call__(self, document: Document) -> str | None:
        return self.chain(document)

    def keep(self) -> None:
        self.columns.add(*self.chain.last)

    def take(self) -> dict | None:
        return self.columns.take()

    @property
    def dropped(self) -> dict:
        return self.chain.dropped

    @property
    def changed(self) -> dict:
        return self.chain.changed


def doc(text: str, kind: str = "html", url: str = "https://news.example.com/a") -> Document:
    return Document("id", text, url=url, date="2024", source="f@0", kind=kind)


def test_parse_filters_and_options() -> None:
    assert parse_filters("fineweb, gopher,c4") == \
        ("gopher_repetition", "gopher_quality", "c4", "fineweb")
    assert parse_filters("") == ()
    with pytest.raises(ValueError, match="unknown filter 'gopherr'"):
        parse_filters("gopherr")
    assert parse_filter_options('{"c4.min_num_sentences": 2}') == (("c4.min_num_sentences", 2),)
    with pytest.raises(ValueError, match="unknown option 'c4.nope'"):
        parse_filter_options('{"c4.nope": 1}')
    with pytest.raises(ValueError, match="not JSON"):
        parse_filter_options("{")


def test_config_turns_the_web_steps_on_only_when_asked() -> None:
    assert PipelineConfig().web_config is None
    assert "filters" not in PipelineConfig().for_manifest()
    cfg = PipelineConfig(filters="gopher", languages="EN,de", pii="mask")
    web = cfg.web_config
    assert web is not None and web.languages == ("de", "en") and web.pii and web.metadata
    assert cfg.for_manifest()["filters"] == "gopher"
    with pytest.raises(ValueError, match="pii"):
        PipelineConfig(pii="remove")
    with pytest.raises(ValueError, match="unknown filter"):
        PipelineConfig(filters="c5")


def test_extraction_counts_extracted_empty_failed_and_not_html() -> None:
    steps = WebSteps(WebConfig(metadata=True))
    text = steps(doc(html(f"<p>{PROSE}</p>")))
    assert text is not None and "committee" in text and "Home | About" not in text
    steps.keep()
    assert steps(doc("<html><body><script>x()</script></body></html>")) is None
    assert steps(doc("%PDF", kind="other:application/pdf")) is None
    assert steps.changed["extracted"] == 1
    assert dict(steps.dropped) == {"extract_empty": 1, "not_html": 1}
    assert steps.take() == {"url": ["https://news.example.com/a"], "date": ["2024"],
                            "source": ["f@0"], "lang": [None], "lang_score": [None]}


def test_language_filter_and_scores() -> None:
    steps = WebSteps(WebConfig(languages=("de",), identify=True, metadata=True))
    assert steps(doc(PROSE, kind="text")) is None
    german = ("Der Ausschuss traf sich am Dienstag, um den Plan zu pr\u00fcfen. Es wurde "
              "vereinbart, dass das Budget gek\u00fcrzt werden muss.")
    assert steps(doc(german, kind="text")) == german
    steps.keep()
    meta = steps.take()
    assert meta is not None and meta["lang"] == ["de"] and meta["lang_score"][0] > 0.9
    assert dict(steps.dropped) == {"language": 1}


def test_rule_sets_count_by_rule_and_reason() -> None:
    steps = WebSteps(WebConfig(filters=parse_filters("gopher,c4,fineweb")))
    assert steps(doc(PROSE, kind="text")) is not None
    assert steps(doc("too short. really.", kind="text")) is None
    assert steps(doc(PROSE + "\nvar x = {a: 1};", kind="text")) is not None
    assert steps(doc(PROSE.replace(". ", ". {x} "), kind="text")) is None
    # repetition runs first: "too short" is 9 of 18 characters, over top_2_gram's 0.2
    assert dict(steps.dropped) == {"gopher_repetition.top_2_gram": 1, "c4.curly_bracket": 1}
    assert steps.changed["c4.lines_removed"] == 1  # the code line without end punctuation
    relaxed = WebSteps(WebConfig(filters=("gopher_quality",),
                                 filter_options=parse_filter_options(
                                     '{"gopher_quality.min_doc_words": 2}')))
    assert relaxed(doc("Too short but enough of the words.", kind="text"))


def test_url_blocklist() -> None:
    block = parse_blocklist("# ads\nads.example.com\n*.spam.test\nhttps://x.org/page/\n")
    assert blocked("http://ads.example.com/x", block)
    assert blocked("https://a.b.spam.test/", block)
    assert blocked("https://x.org/page", block)
    assert not blocked("https://x.org/other", block)
    assert not blocked("https://example.com/", block) and not blocked(None, block)


def test_pii_masks_emails_and_public_ips_only() -> None:
    text, n_email, n_ip = mask("Write to jane.doe@corp.com or bob@x.io; server 8.8.8.8, "
                               "router 192.168.1.1, version 1.2.3.4.5")
    assert "jane" not in text and "bob@" not in text and "8.8.8.8" not in text
    assert "192.168.1.1" in text and (n_email, n_ip) == (2, 2)  # 1.2.3.4 is public too
    assert mask(text)[1:] == (2, 0)  # stand-ins are not public addresses


@given(st.text(max_size=100))
def test_pii_leaves_no_public_address(text: str) -> None:
    import ipaddress

    from pipeline.web.pii import EMAIL, IPV4

    out = mask(text)[0]
    assert all(m.group().endswith(("example.com", "example.org")) for m in EMAIL.finditer(out))
    for m in IPV4.finditer(out):
        assert not ipaddress.ip_address(m.group()).is_global
