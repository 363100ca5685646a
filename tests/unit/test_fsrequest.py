"""What a failed request means: retried or not, from the server's answer however it is wrapped."""

from dali_shards.io.fsrequest import answer_status, permanent


class ClientError(Exception):
    """Stands for botocore's: the answer's metadata in ``response``."""

    def __init__(self, status):
        super().__init__("An error occurred (InvalidRange)")
        self.response = {"Error": {"Code": "InvalidRange"}, "ResponseMetadata": {"HTTPStatusCode": status}}


class PayloadError(Exception):
    """Stands for aiohttp's ClientPayloadError, caused by a ContentLengthError whose code is 400."""


def wrapped(inner):
    try:
        try:
            raise inner
        except Exception as exc:
            raise OSError(22, "The requested range is not satisfiable") from exc
    except OSError as outer:
        return outer


def test_an_answer_wrapped_by_the_backend_is_found():
    assert answer_status(wrapped(ClientError(416))) == 416 and permanent(wrapped(ClientError(416)))
    assert answer_status(wrapped(ClientError(503))) == 503 and not permanent(wrapped(ClientError(503)))


def test_a_body_cut_short_is_retried_whatever_its_cause_says():
    cause = Exception("Not enough data to satisfy content length header")
    cause.code = 400
    try:
        raise PayloadError("Response payload is not completed") from cause
    except PayloadError as exc:
        assert answer_status(exc) is None and not permanent(exc)


def test_missing_files_are_permanent():
    assert permanent(FileNotFoundError("x")) and not permanent(ConnectionResetError())


class Pieces:
    """A store without streaming reads (``cat_file``), logging the ranges asked."""

    def __init__(self, data):
        self.data, self.calls = data, []

    def cat_file(self, path, start, end):
        self.calls.append((start, end))
        return self.data[start:end]


class Sink:
    def __init__(self, filled=0):
        self.filled, self.added = filled, []

    def add(self, data):
        self.added.append(data)
        self.filled += len(data)


def test_pieces_come_whole_only_into_an_empty_sink():
    import pytest

    from dali_shards.io.fsrequest import Cancelled, read_pieces
    from dali_shards.options import StorageOptions

    data = bytes(range(256)) * 100
    cfg = StorageOptions(chunk_size=10_000)
    fs = Pieces(data)
    whole = read_pieces(fs, "p", 100, 5100, Sink(), cfg, "mem://p", lambda: False)
    assert whole == data[100:5100] and fs.calls == [(100, 5100)], "one answer, returned as it is"
    resumed = Sink(filled=100)  # a retry after part of the range arrived
    assert read_pieces(fs, "p", 200, 5100, resumed, cfg, "mem://p", lambda: False) is None
    assert resumed.added == [data[200:5100]], "added after what arrived, not returned in its place"
    split = Sink()
    assert read_pieces(Pieces(data), "p", 0, 25_000, split, cfg, "mem://p", lambda: False) is None
    assert b"".join(split.added) == data[:25_000] and len(split.added) == 3, "chunk_size pieces"
    with pytest.raises(Cancelled):
        read_pieces(fs, "p", 0, 10, Sink(), cfg, "mem://p", lambda: True)
