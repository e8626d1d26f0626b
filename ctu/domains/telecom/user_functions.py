"""What telecom tasks call on the user's side: the actions of their initial states (``turn_data_off``,
``break_vpn``, ...) and the checks of their ENV_ASSERTIONs (``assert_mobile_data_status``, ...), with tau2's
names; ``USER_FUNCTIONS`` maps every name a task may use, the user's tools included.
"""

from __future__ import annotations

from typing import Any

from ctu.domains.base import DBView
from ctu.domains.telecom.phone import (
    can_send_mms_now,
    device,
    edit_device,
    mobile_data_working,
    on_off,
    set_permission,
    simulate_network_search,
    speed_test,
    surroundings,
    toggle,
    toggle_airplane,
)
from ctu.domains.telecom.user_tools import USER_TOOLS, connect_vpn


def set_user_info(db: DBView, name: str, phone_number: str) -> None:
    db.edit("user", "surroundings").update(name=name, phone_number=phone_number)


def set_user_location(db: DBView, abroad: bool) -> None:
    db.edit("user", "surroundings")["is_abroad"] = abroad


def _set_flag(db: DBView, key: str, value: bool, flip) -> None:
    """tau2's ``turn_*_on/off``: toggle, and toggle again if that went the wrong way."""
    if flip(db) != value:
        flip(db)


def turn_airplane_mode_on(db: DBView) -> str:
    _set_flag(db, "airplane_mode", True, toggle_airplane)
    return "Airplane Mode is now ON."


def turn_airplane_mode_off(db: DBView) -> str:
    _set_flag(db, "airplane_mode", False, toggle_airplane)
    return "Airplane Mode is now OFF."


def unseat_sim_card(db: DBView) -> str:
    edit_device(db)["sim_card_missing"] = True
    simulate_network_search(db)
    return "SIM card un-seated successfully."


def lock_sim_card(db: DBView, mode: str) -> str:
    if mode in ("pin", "puk"):
        edit_device(db)["sim_card_status"] = f"locked_{mode}"
    simulate_network_search(db)
    return f"SIM card locked successfully in {mode} mode."


def turn_data_on(db: DBView) -> str:
    edit_device(db)["data_enabled"] = True  # tau2: no network search here
    return "Data connection restored."


def turn_data_off(db: DBView) -> str:
    _set_flag(db, "data_enabled", False, lambda v: toggle(v, "data_enabled"))
    return "Data connection broken."


def turn_roaming_on(db: DBView) -> str:
    _set_flag(db, "roaming_enabled", True, lambda v: toggle(v, "roaming_enabled"))
    return "Data Roaming is now ON."


def turn_roaming_off(db: DBView) -> str:
    _set_flag(db, "roaming_enabled", False, lambda v: toggle(v, "roaming_enabled"))
    return "Data Roaming is now OFF."


def turn_data_saver_mode_on(db: DBView) -> str:
    _set_flag(db, "data_saver_mode", True, lambda v: toggle(v, "data_saver_mode", search=False))
    return "Data Saver Mode is now ON."


def turn_data_saver_mode_off(db: DBView) -> str:
    _set_flag(db, "data_saver_mode", False, lambda v: toggle(v, "data_saver_mode", search=False))
    return "Data Saver Mode is now OFF."


def break_apn_settings(db: DBView) -> str:
    edit_device(db)["active_apn_settings"]["apn_name"] = "broken"
    simulate_network_search(db)
    return "APN settings broken. Please call reset_apn_settings() to fix."


def break_apn_mms_setting(db: DBView) -> str:
    edit_device(db)["active_apn_settings"]["mmsc_url"] = None
    return "APN MMS setting broken. Please call reset_apn_settings() to fix."


def set_wifi_calling(db: DBView, enabled: bool, mms_over_wifi: bool | None = None) -> str:
    d = edit_device(db)
    d["wifi_calling_enabled"] = enabled
    message = f"Wi-Fi Calling is now {on_off(enabled)}."
    if mms_over_wifi is not None:
        d["wifi_calling_mms_over_wifi"] = mms_over_wifi
        message += f"\nMMS over Wi-Fi is now {on_off(mms_over_wifi)}."
    return message


def break_vpn(db: DBView) -> str:
    connect_vpn.effect(db)
    db.put("user", "vpn_default", {"server_performance": "poor"})  # tau2 degrades its shared default VPN
    details = device(db)["vpn_details"]
    edit_device(db)["vpn_details"] = {**details, "server_performance": "poor"}
    return "VPN connection broken."


def remove_app_permission(db: DBView, app_name: str, permission: str) -> tuple[bool, str]:
    return set_permission(db, app_name, permission, False)


def assert_airplane_mode_status(db: DBView, expected_status: bool) -> bool:
    return device(db)["airplane_mode"] == expected_status


def assert_service_status(db: DBView, expected_status: str) -> bool:
    return device(db)["network_connection_status"] == expected_status


def assert_mobile_data_status(db: DBView, expected_status: bool) -> bool:
    return mobile_data_working(db) == expected_status


def assert_mobile_roaming_status(db: DBView, expected_status: bool) -> bool:
    return device(db)["roaming_enabled"] == expected_status


def assert_mobile_data_saver_mode_status(db: DBView, expected_status: bool) -> bool:
    return device(db)["data_saver_mode"] == expected_status


def assert_internet_speed(db: DBView, expected_speed: float, expected_desc: str | None = None) -> bool:
    speed, label = speed_test(db)
    speed = speed or 0.0
    return speed >= expected_speed and (expected_desc is None or label.lower() == expected_desc.lower())


def assert_internet_not_excellent(db: DBView) -> bool:
    return speed_test(db)[1].lower() != "excellent"


def assert_can_send_mms(db: DBView, expected_status: bool) -> bool:
    return can_send_mms_now(db) == expected_status


def assert_mobile_data_usage_exceeded(db: DBView, expected_status: bool) -> bool:
    return surroundings(db)["mobile_data_usage_exceeded"] == expected_status


USER_FUNCTIONS: dict[str, Any] = {
    **{t.name: t.effect for t in USER_TOOLS},
    **{fn.__name__: fn for fn in (
        set_user_info, set_user_location, turn_airplane_mode_on, turn_airplane_mode_off, unseat_sim_card,
        lock_sim_card, turn_data_on, turn_data_off, turn_roaming_on, turn_roaming_off, turn_data_saver_mode_on,
        turn_data_saver_mode_off, break_apn_settings, break_apn_mms_setting, set_wifi_calling, break_vpn,
        remove_app_permission, simulate_network_search, assert_airplane_mode_status, assert_service_status,
        assert_mobile_data_status, assert_mobile_roaming_status, assert_mobile_data_saver_mode_status,
        assert_internet_speed, assert_internet_not_excellent, assert_can_send_mms,
        assert_mobile_data_usage_exceeded)},
}
