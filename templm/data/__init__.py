"""Documents, queries, corpus readers and the embedded temporal world."""

from templm.data.records import Answer, DataError, Document, Query, parse_date
from templm.data.readers import (
    FORMATS,
    ArxivReader,
    JsonlReader,
    Reader,
    TemplamaReader,
    WmtDocsReader,
    open_text,
    read_documents,
)

__all__ = [
    "Answer", "DataError", "Document", "Query", "parse_date", "FORMATS", "ArxivReader", "JsonlReader", "Reader",
    "TemplamaReader", "WmtDocsReader", "open_text", "read_documents",
]
