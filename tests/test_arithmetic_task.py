from reasonrl.rewards.basic import exact_answer, extract_answer, worked_format
from reasonrl.tasks.arithmetic import ArithmeticTask, true_answer, worked_solution


def test_solutions_are_correct_and_careless_ones_wrong():
    assert worked_solution("(a+b)*c", 3, 4, 5) == "3+4=7;7*5=35;####35"
    assert worked_solution("(a+b)*c", 3, 4, 5, careless=True) == "4*5=20;3+20=23;####23"
    assert worked_solution("c*(a+b)", 3, 4, 5, careless=True) == "5*3=15;15+4=19;####19"
    assert worked_solution("c*b+a", 3, 4, 5) == "5*4=20;20+3=23;####23"
    assert true_answer("c*(a+b)", 3, 4, 5) == 35


def test_eval_split_never_overlaps_training():
    task = ArithmeticTask()
    eval_prompts = {p.prompt for p in task.eval_problems(len(task._eval))}
    seen = {p.prompt for step in range(200) for p in task.train_problems(step, 64, seed=0)}
    assert eval_prompts and not eval_prompts & seen


def test_train_stream_is_a_function_of_step_and_seed():
    task = ArithmeticTask()
    assert task.train_problems(5, 8, 0) == task.train_problems(5, 8, 0)
    assert task.train_problems(5, 8, 0) != task.train_problems(6, 8, 0)
    assert task.train_problems(5, 8, 0) != task.train_problems(5, 8, 1)


def test_correct_solutions_score_and_careless_fraction():
    task = ArithmeticTask()
    problems = [p for s in range(20) for p in task.warmup_problems(s, 50, 0)]
    for p in problems:
        assert worked_format(p.solution, p) == 1.0
    bracketed = [p for p in problems if p.meta["bracketed"]]
    wrong = sum(exact_answer(p.solution, p) == 0.0 for p in bracketed)
    # 70% careless, minus the few where ignoring brackets happens to give the right answer.
    assert 0.6 < wrong / len(bracketed) < 0.75
    plain = [p for p in problems if not p.meta["bracketed"]]
    assert plain, "every warm-up problem is bracketed"
    assert all(exact_answer(p.solution, p) == 1.0 for p in plain)
    assert extract_answer("1+2=3;####3") == "3" and extract_answer("no answer") is None


def test_few_shot_template_and_exemplars_leave_the_stream():
    plain = ArithmeticTask()
    task = ArithmeticTask(template="Question: What is {expr}?\nAnswer:", few_shot=2)
    prompt = task.train_problems(0, 1, 0)[0].prompt
    blocks = prompt.split("\n\n")
    assert len(blocks) == 3 and blocks[-1].startswith("Question: What is ") and blocks[-1].endswith("?\nAnswer:")
    shots = {b.split("?\n")[0] for b in blocks[:2]}
    seen = {p.prompt.split("\n\n")[-1].split("?\n")[0] for s in range(300) for p in task.train_problems(s, 64, 0)}
    assert not shots & seen  # an exemplar is never a training question
    assert task.stop_strings == ["\n\n"] and plain.stop_strings == []
    assert len(task._train) == len(plain._train) - 2
