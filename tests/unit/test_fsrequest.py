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
