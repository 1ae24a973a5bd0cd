import pytest

from reasonrl.config import ConfigError, load_recipe, recipe_from_dict


def write(tmp_path, text):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path


def test_defaults_and_overrides(tmp_path):
    path = write(tmp_path, "optim: {lr: 1.0e-3}\nadvantage: {name: grpo, scale: none}\n")
    r = load_recipe(path, ["train.steps=7", "loss.kl.coef=0.1", "rollout.temperature=0.5", "optim.weight_decay=1e-2"])
    assert r.optim.weight_decay == 0.01  # YAML 1.1 reads 1e-2 as a string; it is still a number
    assert r.optim.lr == 1e-3 and r.train.steps == 7 and r.loss.kl.coef == 0.1
    assert r.rollout.temperature == 0.5
    assert r.advantage.name == "grpo" and r.advantage.params == {"scale": "none"}
    assert r.rewards[0].name == "exact_answer"


def test_unknown_key_names_key_and_closest_match(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_recipe(write(tmp_path, "optim: {lrate: 0.1}\n"))
    msg = str(err.value)
    assert "optim.lrate" in msg and "Did you mean 'lr'" in msg and str(tmp_path) in msg


def test_bad_literal_lists_allowed_values():
    with pytest.raises(ConfigError) as err:
        recipe_from_dict({"loss": {"agg": "token_mean"}})
    msg = str(err.value)
    assert "loss.agg" in msg and "seq-mean-token-sum-norm" in msg and "'token-mean'" in msg


def test_unknown_registry_name_and_param():
    with pytest.raises(ConfigError) as err:
        recipe_from_dict({"advantage": {"name": "grp"}})
    assert "unknown advantage estimator 'grp'" in str(err.value) and "'grpo'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        recipe_from_dict({"advantage": {"name": "grpo", "scael": "group"}})
    assert "advantage.scael" in str(err.value) and "'scale'" in str(err.value)
    with pytest.raises(ConfigError, match="unknown policy loss 'ppo'"):
        recipe_from_dict({"loss": {"policy": "ppo"}})
    with pytest.raises(ConfigError, match="rewards\\[0\\].name"):
        recipe_from_dict({"rewards": [{"name": "exact"}]})


def test_type_and_range_errors(tmp_path):
    with pytest.raises(ConfigError, match="train.steps' must be an integer"):
        recipe_from_dict({"train": {"steps": "ten"}})
    with pytest.raises(ConfigError, match="num_generations must be >= 2"):
        recipe_from_dict({"rollout": {"num_generations": 1}})
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_recipe(write(tmp_path, "train: {steps: [1,\n"))
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_recipe(write(tmp_path, "train: 5\n"))
    with pytest.raises(ConfigError, match="cannot read recipe"):
        load_recipe(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="model.tiny.hidden"):
        recipe_from_dict({"model": {"tiny": {"hidden": 3}}})


def test_round_trip_through_dict():
    r = recipe_from_dict({"advantage": {"name": "rloo"}, "rewards": [{"name": "format", "weight": 0.5}]})
    again = recipe_from_dict(r.to_dict())
    assert again == r


def test_clip_options_must_fit_the_policy_loss():
    with pytest.raises(ConfigError, match="loss.epsilon does not apply to loss.policy 'cispo'"):
        recipe_from_dict({"loss": {"policy": "cispo", "epsilon": 0.2}})
    with pytest.raises(ConfigError, match="loss.dual_clip does not apply to loss.policy 'gspo'"):
        recipe_from_dict({"loss": {"policy": "gspo", "dual_clip": 3.0}})
    assert recipe_from_dict({"loss": {"policy": "cispo", "epsilon_high": 4.0}}).loss.epsilon_high == 4.0


def test_no_reward_function_only_where_the_rollouts_bring_their_own_reward():
    with pytest.raises(ConfigError, match="at least one reward function is required"):
        recipe_from_dict({"rewards": []})
    with_env = recipe_from_dict({"rewards": [], "task": {"name": "arithmetic_tools"}, "env": {"name": "calculator"}})
    assert with_env.rewards == []


def test_set_steps_into_a_list_by_index(tmp_path):
    path = write(tmp_path, "rewards:\n  - {name: exact_answer, weight: 1.0}\n  - {name: format, weight: 0.5}\n")
    r = load_recipe(path, ["rewards.1.weight=0.25", "rewards.0.name=exact_answer"])
    assert [(rw.name, rw.weight) for rw in r.rewards] == [("exact_answer", 1.0), ("format", 0.25)]
    with pytest.raises(ConfigError, match=r"'rewards' is a list of 2; '2' is not an index of it \(0 to 1\)"):
        load_recipe(path, ["rewards.2.weight=1"])
    with pytest.raises(ConfigError, match="'weight' is not an index"):
        load_recipe(path, ["rewards.weight=1"])
    with pytest.raises(ConfigError, match="'name' is not a section"):
        load_recipe(path, ["rewards.0.name.x=1"])
