"""The policy round as it was before the rebuild (core/state.py, the Manager, and the
accelmux policy's parts wired through one class), kept only to prove the rebuilt round
decides alike: ``tests/core/test_old_round.py`` drives both with the same random event
streams. Delete it with that test once nobody needs the comparison any more.

A copy, not the product: every module here is the one at commit 9e5ba0d (the last before
core/world/), with its imports pointed here.
"""
