"""Make `ansible_collections.llmops.vllm` importable from this checkout, as Ansible itself finds it."""

from pathlib import Path

from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder

CHECKOUT = Path(__file__).resolve().parents[2]
COLLECTIONS_ROOT = CHECKOUT / ".build" / "collections"


def pytest_sessionstart(session):
    link = COLLECTIONS_ROOT / "ansible_collections" / "llmops" / "vllm"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../../../.."))
    # The `ansible` package ships a regular ansible_collections package; Ansible's finder merges paths.
    _AnsibleCollectionFinder(paths=[str(COLLECTIONS_ROOT)])._install()
