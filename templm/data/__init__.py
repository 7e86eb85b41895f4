"""Data: documents, queries and corpus readers, the embedded temporal world, splits, vocabularies, TempLAMA from
Wikidata, salient spans and the task records, the language-model token streams, and the CALM corpus format."""

from templm.data.records import Answer, Document, Query, parse_date
from templm.errors import DataError
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
