"""PII masking: e-mail addresses and public IP addresses replaced by fixed stand-ins, as
datatrove's ``PIIFormatter`` and NeMo Curator's PII modifier do.

The stand-ins cycle per document (not across documents as datatrove's do), so a document's
output never depends on which documents a worker saw before it.
"""

from __future__ import annotations

import ipaddress
import re

EMAIL = re.compile(
    r"\b[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
    r"@(?:(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z0-9](?:[A-Za-z0-9-]*"
    r"[A-Za-z0-9])?|\[(?:\d{1,3}\.){3}\d{1,3}\])")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)"
IPV4 = re.compile(rf"(?:{_OCTET}\.){{3}}{_OCTET}")
EMAIL_STANDINS = ("email@example.com", "firstname.lastname@example.org")
#: documentation addresses (RFC 5737): never anyone's
IP_STANDINS = ("192.0.2.1", "198.51.100.2", "203.0.113.3")


def _public(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_global
    except ValueError:
        return False


def mask(text: str) -> tuple[str, int, int]:
    """``(masked text, e-mails masked, IPs masked)``; only public IPs are masked."""
    n_email = n_ip = 0
    if "@" in text:
        def email(m: re.Match[str]) -> str:
            nonlocal n_email
            n_email += 1
            return EMAIL_STANDINS[(n_email - 1) % len(EMAIL_STANDINS)]
        text = EMAIL.sub(email, text)
    if "." in text:
        def ip(m: re.Match[str]) -> str:
            nonlocal n_ip
            if not _public(m.group()):
                return m.group()
            n_ip += 1
            return IP_STANDINS[(n_ip - 1) % len(IP_STANDINS)]
        text = IPV4.sub(ip, text)
    return text, n_email, n_ip
