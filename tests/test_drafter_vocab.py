"""The draft vocabulary: top ids by (-count, id), ascending, padded, hashed, never silently rebuilt."""

from __future__ import annotations

import numpy as np
import pytest

from draftgate.drafter import vocab as vc


def counts_of(pairs: dict[int, int], size: int = 50) -> np.ndarray:
    c = np.zeros(size, dtype=np.int64)
    for i, n in pairs.items():
        c[i] = n
    return c


def test_the_map_keeps_the_most_frequent_ids_with_ties_to_the_smaller_id_sorted_ascending():
    counts = counts_of({40: 9, 3: 5, 7: 5, 12: 5, 30: 1})
    vmap = vc.build_vocab_map(counts, 3, "sha")
    # 40 (9) first; among the three fives, ids 3 and 7 beat 12; then sorted ascending.
    assert vmap.draft_ids.tolist() == [3, 7, 40]


def test_fewer_distinct_ids_than_the_size_are_padded_with_the_smallest_unseen_ids():
    counts = counts_of({5: 2, 9: 1})
    vmap = vc.build_vocab_map(counts, 5, "sha")
    assert vmap.draft_ids.tolist() == [0, 1, 2, 5, 9]
    assert vmap.size == 5 and vmap.seen == 2


def test_d2t_offsets_and_the_t2d_mask_name_the_same_target_ids():
    vmap = vc.build_vocab_map(counts_of({4: 3, 11: 2, 20: 1}), 3, "sha")
    d = np.arange(vmap.size)
    assert (d + vmap.d2t).tolist() == [4, 11, 20]
    assert np.flatnonzero(vmap.t2d).tolist() == [4, 11, 20]
    assert vmap.d2t.dtype == np.int64 and vmap.t2d.dtype == bool and vmap.t2d.shape == (50,)


def test_counting_is_deterministic_whatever_the_row_order():
    rows = [(np.array([1, 2, 3, 3]), np.array([0, 1, 1, 1])), (np.array([3, 4, 4]), np.array([1, 1, 0]))]
    a = vc.build_vocab_map(vc.count_tokens(rows, 10), 2, "sha")
    b = vc.build_vocab_map(vc.count_tokens(rows[::-1], 10), 2, "sha")
    assert a.map_sha256 == b.map_sha256 and a.draft_ids.tolist() == [2, 3]


def test_only_tokens_under_the_loss_mask_are_counted():
    counts = vc.count_tokens([(np.array([7, 7, 7, 8]), np.array([0, 0, 0, 1]))], 10)
    assert counts[7] == 0 and counts[8] == 1


def test_an_id_outside_the_target_vocabulary_is_an_error():
    with pytest.raises(vc.VocabError, match="outside the target vocabulary"):
        vc.count_tokens([(np.array([12]), np.array([1]))], 10)


def test_a_map_from_changed_data_is_refused_naming_both_data_hashes():
    old = vc.build_vocab_map(counts_of({1: 5, 2: 4}), 2, "a" * 64)
    new = vc.build_vocab_map(counts_of({1: 5, 3: 4}), 2, "b" * 64)
    with pytest.raises(vc.VocabError) as e:
        vc.require_same(old, new, "checkpoint x")
    assert "a" * 64 in str(e.value) and "b" * 64 in str(e.value)
    vc.require_same(old, vc.build_vocab_map(counts_of({1: 9, 2: 1}), 2, "c" * 64), "same ids")   # same map: fine


def test_a_saved_map_loads_back_with_its_data_hash(tmp_path):
    vmap = vc.build_vocab_map(counts_of({4: 3, 11: 2}), 4, "d" * 64, "kept rows, split in ['train']")
    vc.save(vmap, tmp_path / "vocab.safetensors")
    back = vc.load(tmp_path / "vocab.safetensors")
    assert back.map_sha256 == vmap.map_sha256 and back.data_sha256 == "d" * 64
    assert back.selection == vmap.selection


def test_the_map_of_a_real_tokens_table_counts_the_chosen_splits_completions(tmp_path, smollm2_tok):
    from hidden_fixtures import token_rows, write_tokens

    rows = token_rows(smollm2_tok, 4)
    rows[3] = {**rows[3], "split": "heldout"}
    path = write_tokens(tmp_path / "tokens.parquet", rows)
    vmap, ids, counts = vc.vocab_from_tokens(path, ["train"], 64, smollm2_tok.vocab_size)
    assert ids == [r["prompt_id"] for r in rows[:3]]
    expected = {t for r in rows[:3] for t in r["completion_ids"]}
    assert set(np.flatnonzero(counts)) == expected
    assert set(expected) <= set(vmap.draft_ids.tolist())          # fewer than 64 seen: all kept, padded
    assert vmap.data_sha256 == vc.file_sha256(path)
