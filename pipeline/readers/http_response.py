"""A WARC response record's payload split into its HTTP header block and body.

FastWARC's HTTP parser needs CRLF line ends, in strict mode or not: on ClueWeb09's records,
whose header lines end with a bare LF (Resiliparse's own ``clueweb-quirk`` test file), it
read the page's first 10 KB as headers and handed on the rest as the body. Here, as in
warcio and browsers, a line ends at LF with or without CR, and the block ends at the first
empty line. Pure functions of bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: a header block longer than this is not one (warcio reads lines of at most 64 KiB too)
MAX_HEAD = 1 << 16
_CHARSET = re.compile(r";\s*charset\s*=\s*[\"']?([^\"';\s]+)", re.IGNORECASE)
#: fields whose repeats are one comma-separated list (RFC 9110 5.3); others: the last wins
_LISTS = frozenset({"transfer-encoding", "content-encoding"})


class MalformedHead(ValueError):
    """The payload has no HTTP header block that ends."""


@dataclass(frozen=True)
class Response:
    status: str
    #: lower-cased field names
    fields: dict[str, str]
    body: bytes

    def field(self, name: str) -> str | None:
        return self.fields.get(name.lower())

    @property
    def mime(self) -> str:
        return (self.field("content-type") or "").split(";")[0].strip().lower()

    @property
    def charset(self) -> str | None:
        found = _CHARSET.search(self.field("content-type") or "")
        return found.group(1) if found else None


def split_response(payload: bytes) -> Response:
    """Status line, header fields and body of an HTTP response as a WARC record stores it."""
    lines: list[bytes] = []
    pos = 0
    while True:
        end = payload.find(b"\n", pos, MAX_HEAD)
        if end < 0:
            what = ("longer than 64 KiB" if len(payload) >= MAX_HEAD
                    else "not ended by an empty line")
            raise MalformedHead(f"HTTP header block {what}")
        line = payload[pos:end].rstrip(b"\r")
        pos = end + 1
        if not line:
            if lines:
                break
            continue  # blank lines before the status line
        lines.append(line)
    status = lines[0].decode("latin-1").strip()
    if not status.startswith("HTTP/"):
        raise MalformedHead(f"HTTP status line expected, found {status[:60]!r}")
    fields: dict[str, str] = {}
    last = ""
    for raw in lines[1:]:
        text = raw.decode("latin-1")
        if text[:1] in (" ", "\t") and last:  # obsolete line folding
            fields[last] += " " + text.strip()
            continue
        name, sep, value = text.partition(":")
        if not sep:
            continue  # not a field: ignored, as browsers do
        last = name.strip().lower()
        value = value.strip()
        if last in fields and last in _LISTS:
            fields[last] += ", " + value
        else:
            fields[last] = value
    return Response(status, fields, payload[pos:])
