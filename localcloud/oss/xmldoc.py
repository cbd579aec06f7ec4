"""XML in and out, in OSS's shapes. Note: OSS documents carry NO xmlns (oss2 parses with un-namespaced
find(), so an S3-style namespace makes every listing silently empty — see reference/harness.md Q3).

A document is written as nested (tag, value) tuples: value is text, a number, a bool, None (empty element)
or a list of child tuples; repeating a tag in the list repeats the element.
"""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from email.utils import formatdate
from typing import Union

from csbench.localcloud.oss.errors import malformed_xml

Value = Union[str, int, bool, None, list["Node"]]
Node = tuple[str, Value]


def _build(parent: ET.Element, nodes: list[Node]) -> None:
    for tag, value in nodes:
        child = ET.SubElement(parent, tag)
        if isinstance(value, list):
            _build(child, value)
        elif isinstance(value, bool):
            child.text = "true" if value else "false"
        elif value is not None:
            child.text = str(value)


def render(root: str, nodes: list[Node]) -> bytes:
    elem = ET.Element(root)
    _build(elem, nodes)
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(elem, encoding="utf-8", xml_declaration=False)


def iso8601(ts: float) -> str:
    """2024-01-02T03:04:05.000Z: OSS always writes ".000" (oss2's parser rejects anything else)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(ts))


def http_date(ts: float) -> str:
    return formatdate(ts, usegmt=True)


# ------------------------------------------------------------------------------------- request bodies
def _parse(body: bytes, root: str) -> ET.Element:
    try:
        elem = ET.fromstring(body)
    except ET.ParseError as e:
        raise malformed_xml(f"not well-formed: {e}") from None
    if elem.tag != root:
        raise malformed_xml(f"root element is <{elem.tag}>, expected <{root}>")
    return elem


def parse_delete(body: bytes) -> tuple[bool, list[str]]:
    """<Delete><Quiet>true</Quiet><Object><Key>k</Key></Object>...</Delete> -> (quiet, keys)."""
    root = _parse(body, "Delete")
    quiet_text = (root.findtext("Quiet") or "false").strip().lower()
    if quiet_text not in ("true", "false"):
        raise malformed_xml(f"Quiet must be true or false, got {quiet_text!r}")
    keys = []
    for obj in root.findall("Object"):
        key = obj.findtext("Key")
        if key is None:
            raise malformed_xml("an <Object> has no <Key>")
        keys.append(key)
    if not keys:
        raise malformed_xml("no <Object> to delete")
    if len(keys) > 1000:
        raise malformed_xml(f"{len(keys)} objects; at most 1000 per request")
    return quiet_text == "true", keys


def parse_complete(body: bytes) -> list[tuple[int, str]]:
    """<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>"X"</ETag></Part>... -> [(1, "X")]."""
    root = _parse(body, "CompleteMultipartUpload")
    parts = []
    for part in root.findall("Part"):
        number, etag = part.findtext("PartNumber"), part.findtext("ETag")
        if number is None or etag is None:
            raise malformed_xml("a <Part> lacks <PartNumber> or <ETag>")
        try:
            parts.append((int(number), etag.strip().strip('"').upper()))
        except ValueError:
            raise malformed_xml(f"PartNumber {number!r} is not an integer") from None
    if not parts:
        raise malformed_xml("no <Part> in CompleteMultipartUpload")
    return parts


def parse_create_bucket(body: bytes) -> str | None:
    """Optional <CreateBucketConfiguration><StorageClass>..</StorageClass></...>; returns the storage class."""
    if not body.strip():
        return None
    root = _parse(body, "CreateBucketConfiguration")
    return root.findtext("StorageClass")
