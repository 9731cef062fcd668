import numpy as np

from runtime.factory.state_classifier import NgramClassifier, StateClassifier, ngrams


def _corpus(seed: int):
    rng = np.random.default_rng(seed)
    cores = {
        "alert": ["halt who goes there", "stop right there", "state your business"],
        "rest": ["fancy an ale", "long day behind me", "pull up a stool"],
        "trade": ["finest wares in town", "coin first, then goods", "take a look at my stock"],
    }
    voices = ["citizen", "matey", "friend", "child of the light"]
    texts, labels = [], []
    for _ in range(300):
        state = str(rng.choice(list(cores)))
        texts.append(f"{rng.choice(cores[state])}, {rng.choice(voices)}!")
        labels.append(state)
    return texts, labels


def test_ngrams_include_unigrams_and_boundary_bigrams():
    grams = ngrams("Halt, {player}!")
    assert "halt" in grams and "{player}" in grams
    assert "<s> halt" in grams and "! </s>" in grams


def test_classifier_learns_states_and_generalises_to_new_voice_combinations(tmp_path):
    texts, labels = _corpus(0)
    clf = StateClassifier.fit(texts, labels, seed=0)
    assert clf.accuracy(texts, labels) == 1.0
    assert clf.predict(["halt who goes there, good sir!", "fancy an ale, good sir!"]) == ["alert", "rest"]
    clf.save(tmp_path / "clf.npz")
    again = StateClassifier.load(tmp_path / "clf.npz")
    np.testing.assert_allclose(again.predict_proba(texts[:5]), clf.predict_proba(texts[:5]))


def test_classifier_training_is_deterministic_for_a_seed():
    texts, labels = _corpus(1)
    a = StateClassifier.fit(texts, labels, seed=3)
    b = StateClassifier.fit(texts, labels, seed=3)
    np.testing.assert_array_equal(a.weights, b.weights)


def test_one_classifier_class_serves_any_label_and_fit_many_matches_separate_fits():
    texts, states = _corpus(2)
    voices = ["matey" if "matey" in t else "other" for t in texts]
    many = NgramClassifier.fit_many(texts, {"state": states, "voice": voices}, seed=4)
    assert StateClassifier is NgramClassifier
    assert many["voice"].labels == ["matey", "other"]
    assert many["voice"].accuracy(texts, voices) == 1.0
    for name, labels in (("state", states), ("voice", voices)):
        alone = NgramClassifier.fit(texts, labels, seed=4)
        np.testing.assert_array_equal(alone.weights, many[name].weights)
        assert alone.vocab == many[name].vocab
