"""Read tau2's telecom data (db.toml, user_db.toml, policy, manual, tasks) into ctu's shapes.

tau2 keeps the carrier's records as lists (``plans``, ``customers``, ``lines``, ``bills``,
``devices``); ctu keys each list by its id (order kept, so "first match" lookups are tau2's).
Every record is the dict tau2's pydantic model dumps: same field order, defaults filled in,
floats where the model says float, datetimes as ``str(datetime)`` (what tau2's tool results
show, ``json.dumps(default=str)``). The user's side (tau2's ``TelecomUserDB``) is one table,
``user``, with two records: ``device`` (the phone) and ``surroundings`` (where the user is,
what the carrier allows them, the payment request the agent sent).
"""

from __future__ import annotations

import datetime as dt
import os
import tomllib
from pathlib import Path
from typing import Any

from ctu.domains.tau2_data import find_domain_dir, read_tasks

DEFAULT_START_DATE = "2025-01-01"  # tau2's Customer.created_at default (a date, dumped as such)
TABLE_KEYS = {"plans": "plan_id", "customers": "customer_id", "lines": "line_id", "bills": "bill_id",
              "devices": "device_id"}


def _datetime(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    return str(value)


def _date(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        value = value.date()
    if isinstance(value, str):
        value = dt.date.fromisoformat(value[:10])
    return str(value)


def _fields(raw: dict, spec: list[tuple[str, Any, Any]], where: str) -> dict:
    """A record with ``spec``'s fields in order: (name, default or REQUIRED, converter or None)."""
    extra = set(raw) - {name for name, _, _ in spec}
    if extra:
        raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(extra))}")
    out = {}
    for name, default, convert in spec:
        if name not in raw:
            if default is REQUIRED:
                raise ValueError(f"{where}: missing field '{name}'")
            out[name] = default() if callable(default) else default
            continue
        value = raw[name]
        out[name] = convert(value) if convert is not None and value is not None else value
    return out


REQUIRED = object()
_PLAN = [("plan_id", REQUIRED, None), ("name", REQUIRED, None), ("data_limit_gb", REQUIRED, float),
         ("price_per_month", REQUIRED, float), ("data_refueling_price_per_gb", REQUIRED, float)]
_DEVICE = [("device_id", REQUIRED, None), ("device_type", REQUIRED, None), ("model", REQUIRED, None),
           ("imei", None, None), ("is_esim_capable", REQUIRED, None), ("activated", False, None),
           ("activation_date", None, _datetime), ("last_esim_transfer_date", None, _datetime)]
_LINE = [("line_id", REQUIRED, None), ("phone_number", REQUIRED, None), ("status", "Pending Activation", None),
         ("plan_id", REQUIRED, None), ("device_id", None, None), ("data_used_gb", 0.0, float),
         ("data_refueling_gb", 0.0, float), ("roaming_enabled", False, None), ("contract_end_date", None, _date),
         ("last_plan_change_date", None, _date), ("last_sim_replacement_date", None, _date),
         ("suspension_start_date", None, _date)]
_LINE_ITEM = [("description", REQUIRED, None), ("amount", REQUIRED, float), ("date", REQUIRED, _date),
              ("item_type", REQUIRED, None)]
_ADDRESS = [("street", REQUIRED, None), ("city", REQUIRED, None), ("state", REQUIRED, None),
            ("zip_code", REQUIRED, None)]
_PAYMENT_METHOD = [("method_type", REQUIRED, None), ("account_number_last_4", REQUIRED, None),
                   ("expiration_date", REQUIRED, None)]


def _bill(raw: dict, where: str) -> dict:
    spec = [("bill_id", REQUIRED, None), ("customer_id", REQUIRED, None), ("period_start", REQUIRED, _date),
            ("period_end", REQUIRED, _date), ("issue_date", REQUIRED, _date), ("total_due", REQUIRED, float),
            ("due_date", REQUIRED, _date),
            ("line_items", list, lambda items: [_fields(i, _LINE_ITEM, f"{where}.line_items") for i in items]),
            ("status", "Draft", None)]
    return _fields(raw, spec, where)


def _customer(raw: dict, where: str) -> dict:
    spec = [("customer_id", REQUIRED, None), ("full_name", REQUIRED, None), ("date_of_birth", REQUIRED, None),
            ("email", REQUIRED, None), ("phone_number", REQUIRED, None),
            ("address", REQUIRED, lambda a: _fields(a, _ADDRESS, f"{where}.address")),
            ("account_status", "Pending Verification", None),
            ("payment_methods", list, lambda ms: [_fields(m, _PAYMENT_METHOD, f"{where}.payment_methods") for m in ms]),
            ("line_ids", list, list), ("bill_ids", list, list), ("created_at", DEFAULT_START_DATE, _datetime),
            ("last_extension_date", None, _date), ("goodwill_credit_used_this_year", 0.0, float)]
    return _fields(raw, spec, where)


_RECORD = {"plans": lambda r, w: _fields(r, _PLAN, w), "devices": lambda r, w: _fields(r, _DEVICE, w),
           "lines": lambda r, w: _fields(r, _LINE, w), "bills": _bill, "customers": _customer}


def agent_db(raw: dict, source: str = "db.toml") -> dict[str, dict[str, dict]]:
    """tau2's TelecomDB document -> ctu tables keyed by id."""
    extra = set(raw) - set(TABLE_KEYS)
    if extra:
        raise ValueError(f"{source}: unknown table(s) {', '.join(sorted(extra))}")
    db: dict[str, dict[str, dict]] = {}
    for table, key in TABLE_KEYS.items():
        db[table] = {}
        for i, record in enumerate(raw.get(table, [])):
            rec = _RECORD[table](record, f"{source}: {table}[{i}]")
            db[table][rec[key]] = rec
    return db


def default_device() -> dict[str, Any]:
    """tau2's ``MockPhoneAttributes()``: a phone that works."""
    return {
        "sim_card_status": "active", "sim_card_missing": False, "airplane_mode": False,
        "network_signal_strength": "good", "network_technology_connected": "5G",
        "network_connection_status": "connected", "battery_level": 80, "data_enabled": True,
        "roaming_enabled": False, "network_mode_preference": "4g_5g_preferred",
        "active_apn_settings": default_apn(), "wifi_enabled": False, "wifi_connected": False, "wifi_ssid": None,
        "wifi_signal_strength": "none", "wifi_calling_enabled": False, "wifi_calling_mms_over_wifi": False,
        "data_saver_mode": False, "vpn_enabled_setting": False, "vpn_connected": False, "vpn_details": None,
        "app_statuses": {
            "messaging": {"app_name": "messaging",
                          "permissions": {"sms": True, "storage": True, "phone": True, "network": False}},
            "browser": {"app_name": "browser",
                        "permissions": {"sms": False, "storage": True, "phone": False, "network": True}},
        },
    }


def default_apn() -> dict[str, Any]:
    """tau2's ``APNSettings()``."""
    return {"apn_name": "internet", "reset_at_reboot": False, "mms_apn": "mms",
            "mmsc_url": "http://mms.carrier.com/mms/wapenc", "mms_proxy": None, "mms_port": None}


def default_surroundings() -> dict[str, Any]:
    """tau2's ``UserSurroundings()``."""
    return {"name": None, "phone_number": None, "is_abroad": False, "roaming_allowed": False,
            "signal_strength": {"2G": "poor", "3G": "fair", "4G": "good", "5G": "excellent"},
            "mobile_data_usage_exceeded": False, "line_active": True, "payment_request": None}


def _model(defaults: dict, raw: dict, where: str, nested: dict | None = None) -> dict:
    """pydantic's ``Model.model_validate(raw)`` for a model with ``defaults``: given fields replace defaults
    (nested models get their own defaults, via ``nested``), unknown fields are an error."""
    extra = set(raw) - set(defaults)
    if extra:
        raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(extra))}")
    out = dict(defaults)
    for key, value in raw.items():
        out[key] = nested[key](value) if nested and key in nested and value is not None else value
    return out


def _app(name: str, raw: dict, where: str) -> dict:
    if "app_name" not in raw:
        raise ValueError(f"{where}: app_statuses.{name}: missing field 'app_name'")
    perms = {"sms": False, "storage": False, "phone": False, "network": False}
    return {"app_name": raw["app_name"],
            "permissions": _model(perms, raw.get("permissions") or {}, f"{where}: app_statuses.{name}.permissions")}


def device_state(raw: dict, where: str = "device") -> dict[str, Any]:
    """tau2's ``MockPhoneAttributes.model_validate(raw)``."""
    vpn = {"server_address": None, "protocol": None, "server_performance": "unknown"}
    return _model(default_device(), raw, where, {
        "active_apn_settings": lambda v: _model(default_apn(), v, f"{where}.active_apn_settings"),
        "vpn_details": lambda v: _model(vpn, v, f"{where}.vpn_details"),
        "app_statuses": lambda v: {name: _app(name, app, where) for name, app in v.items()},
    })


def user_db(raw: dict, source: str = "user_db.toml") -> dict[str, dict[str, Any]]:
    """tau2's TelecomUserDB document -> the ``user`` table (``device``, ``surroundings``)."""
    extra = set(raw) - {"device", "surroundings"}
    if extra:
        raise ValueError(f"{source}: unknown section(s) {', '.join(sorted(extra))}")
    device = device_state(raw.get("device") or {}, f"{source}: device")
    payment = {"bill_id": None, "amount_due": None, "paid": False}
    surroundings = _model(default_surroundings(), raw.get("surroundings") or {}, f"{source}: surroundings",
                          {"payment_request": lambda v: _model(payment, v, f"{source}: payment_request")})
    return {"user": {"device": device, "surroundings": surroundings}}


def _read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML ({exc})") from None


def read_telecom_files(data_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """{'db': tables, 'policy': str, 'tasks': (Task, ...), 'splits': {...}, 'dir': Path}.

    The agent's policy is tau2's: the main policy and the tech-support manual, each in its tag.
    """
    folder = find_domain_dir("telecom", data_dir, db_file="db.toml")
    db = {**agent_db(_read_toml(folder / "db.toml"), str(folder / "db.toml")),
          **user_db(_read_toml(folder / "user_db.toml"), str(folder / "user_db.toml"))}
    main = (folder / "main_policy.md").read_text(encoding="utf-8")
    manual = (folder / "tech_support_manual.md").read_text(encoding="utf-8")
    policy = (f"<main_policy>\n{main}\n</main_policy>\n"
              f"<tech_support_policy>\n{manual}\n</tech_support_policy>")
    return {"db": db, "policy": policy, **read_tasks(folder), "dir": folder}
