"""`llmrl export --push-to-hub REPO`: the finished export folder uploaded to a hub model repository.

The repository id and the token are checked before anything is exported (a merge can take minutes);
the upload is huggingface_hub's own (`HfApi.create_repo(exist_ok=True)`, then `upload_folder`: one
commit holding every file of the folder, the model card included), to `HF_ENDPOINT` (default
https://huggingface.co) with the token `HF_TOKEN` or `hf auth login` stored.

The repository then holds the folder's files and nothing else: the same commit deletes every file of
the repository the folder lacks (`delete_patterns="*"`; the hub's own .gitattributes stays), so a
merged export pushed over an earlier adapter push leaves no adapter_config.json beside its weights.
Nothing local is deleted. A repository is made with the hub's default visibility (public on
huggingface.co), or private with `private`; a push with `private` to a repository that exists and is
public is refused before anything is uploaded (create_repo does not change an existing one's
visibility). A refused token, an unreachable hub or an offline setting is one sentence that also says
where the export is.
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import HfApi, get_token
from huggingface_hub.errors import HfHubHTTPError, HFValidationError, OfflineModeIsEnabled
from huggingface_hub.utils import validate_repo_id

from ..errors import LLMRLError

TRANSPORT = ("ConnectError", "ConnectTimeout", "ReadTimeout", "WriteTimeout", "PoolTimeout", "RemoteProtocolError",
             "ReadError", "WriteError", "TimeoutException", "NetworkError", "TransportError", "ConnectionError")
"""The class names of the HTTP client's (httpx) network errors: an unreachable or dropped hub."""


def hub_token(repo: str) -> str:
    """The token to push to `repo` with; one sentence when `repo` is not a repository id or there is none."""
    try:
        validate_repo_id(repo)
    except HFValidationError as exc:
        why = str(exc).strip().splitlines()[0].rstrip(".") if str(exc).strip() else "not a repository id"
        raise LLMRLError(f"--push-to-hub '{repo}' is not a hub repository id ({why}); write NAME or "
                         f"NAMESPACE/NAME.") from None
    token = get_token()
    if not token:
        raise LLMRLError("--push-to-hub needs a Hugging Face token that may write to the repository: set HF_TOKEN "
                         "or run `hf auth login`; nothing was exported.")
    return token


def _network(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) is the network failing, not the hub answering."""
    while exc is not None:
        if any(c.__name__ in TRANSPORT for c in type(exc).__mro__):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


def push(folder: Path, repo: str, token: str, message: str, private: bool = False) -> str:
    """Upload `folder` to the model repository `repo` (made if missing, `private` or with the hub's default
    visibility) in one commit that also deletes the repository's files the folder lacks → the commit's URL."""
    api = HfApi(token=token)
    where = f"the hub at {api.endpoint}"
    kept = f"the export is in '{folder}'"
    try:
        api.create_repo(repo, repo_type="model", exist_ok=True, private=True if private else None)
        if private and not api.repo_info(repo, repo_type="model").private:
            raise LLMRLError(f"Did not push: '{repo}' already exists on {where} and is public, and --private does not "
                             f"change an existing repository; make it private there or push without --private; "
                             f"{kept}.", exit_code=1)
        return str(api.upload_folder(repo_id=repo, folder_path=folder, commit_message=message,
                                     delete_patterns="*").commit_url)
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status == 401:
            why = "refused the token (HTTP 401: invalid or expired); set HF_TOKEN or run `hf auth login` again"
        elif status == 403:
            why = f"refused to let this token write to '{repo}' (HTTP 403); use a token with write access"
        else:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            why = f"refused the upload to '{repo}' ({first[:200]})"
        raise LLMRLError(f"Could not push to {where}: it {why}; {kept}.", exit_code=1) from None
    except OfflineModeIsEnabled:
        raise LLMRLError(f"Could not push to {where}: HF_HUB_OFFLINE is set; unset it to push, {kept}.",
                         exit_code=1) from None
    except Exception as exc:
        if not _network(exc):
            raise
        raise LLMRLError(f"Could not reach {where} ({type(exc).__name__}: {str(exc)[:200] or 'no answer'}); {kept}.",
                         exit_code=1) from None
