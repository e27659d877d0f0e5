"""Fixtures of the module_utils tests."""

import pytest
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args


@pytest.fixture
def ansible_module():
    """`ansible_module(check_mode=False)`: a real AnsibleModule, for the helpers that write through its methods."""

    def make(check_mode=False):
        with patch_module_args({"_ansible_check_mode": check_mode}):
            return AnsibleModule(argument_spec={}, supports_check_mode=True)

    return make


@pytest.fixture
def minimax_model_info():
    """The shape of GET /api/models/MiniMaxAI/MiniMax-M2.5/revision/main?blobs=true (sizes of 2 of 126 shards)."""
    return {
        "id": "MiniMaxAI/MiniMax-M2.5",
        "sha": "0f3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a",
        "siblings": [
            {"rfilename": ".gitattributes", "blobId": "a6344aac8c09253b3b630fb776ae94478aa0275b", "size": 1519},
            {"rfilename": "config.json", "blobId": "5b1f0a7e2c4d3e8f9a6b0c1d2e3f4a5b6c7d8e9f", "size": 2734},
            {
                "rfilename": "model-00001-of-00126.safetensors",
                "blobId": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4",
                "size": 1836036096,
                "lfs": {"sha256": "9" * 64, "size": 1836036096, "pointerSize": 135},
            },
            {
                "rfilename": "model-00002-of-00126.safetensors",
                "blobId": "d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d2e3",
                "size": 1833910344,
                "lfs": {"sha256": "8" * 64, "size": 1833910344, "pointerSize": 135},
            },
            {"rfilename": "docs/deploy_guide.md", "size": 9012},
        ],
    }
