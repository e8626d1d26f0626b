"""The telecom user's phone as tau2-bench models it: the device record, the network search, and what works.

The phone is the ``user/device`` record; where the user is and what the carrier allows them is
``user/surroundings`` (kept in step with the carrier's records by :mod:`.coupling`). Rules kept
from tau2: changing airplane mode, SIM, mobile data, roaming, network mode or APN re-runs a
network search (SIM state, preference and the local signal decide the connection; airplane mode,
a broken APN or an inactive line mean no service); mobile data works only with signal, service,
data on, roaming allowed on both sides when abroad, and the data allowance not exceeded; the
speed test is the middle of the technology's range times the signal factor (x0.1 behind a poor
VPN, x0.2 with data saver); MMS needs working data, 3G or better, no Wi-Fi-calling MMS, an MMSC
URL and the messaging app's SMS and storage permissions.
tau2's VPN quirk: ``break_vpn`` degrades tau2's shared default VPN, so every later connection in
that process is poor; ctu keeps that within an episode (a ``user/vpn_default`` record).
"""

from __future__ import annotations

from ctu.domains.base import DBView

NETWORK_MODES = ("4g_5g_preferred", "4g_only", "3g_only", "2g_only")
_MODE_TECH = {"4g_only": "4G", "3g_only": "3G", "2g_only": "2G"}
_SIGNAL_ICON = {"none": "📵 No Signal", "poor": "📶¹ Poor", "fair": "📶² Fair", "good": "📶³ Good",
                "excellent": "📶⁴ Excellent"}
_SPEED_RANGE = {"2G": (0.1, 0.4), "3G": (1.0, 5.0), "4G": (10.0, 100.0), "5G": (50.0, 500.0), "none": (0.0, 0.0)}
_SIGNAL_FACTOR = {"poor": 0.2, "fair": 0.5, "good": 0.8, "excellent": 1.0, "none": 0.0}


# -- state access --------------------------------------------------------------------------
def device(db: DBView) -> dict:
    return db.get("user", "device")


def surroundings(db: DBView) -> dict:
    return db.get("user", "surroundings")


def edit_device(db: DBView) -> dict:
    return db.edit("user", "device")


def sim_status(d: dict) -> str:
    return "missing" if d["sim_card_missing"] else d["sim_card_status"]


def no_service(d: dict) -> None:
    d.update(network_connection_status="no_service", network_technology_connected="none",
             network_signal_strength="none")


def simulate_network_search(db: DBView) -> None:
    """tau2's network search: the SIM, the mode preference and the local signal decide the connection."""
    d, signal = edit_device(db), surroundings(db)["signal_strength"]
    if sim_status(d) == "active":
        d["network_connection_status"] = "connected"
        mode = d["network_mode_preference"]
        if mode == "4g_5g_preferred":
            tech = "4G" if signal.get("5G", "none") == "none" else "5G"
        else:
            tech = _MODE_TECH.get(mode, "4G")
        d["network_technology_connected"] = tech
        d["network_signal_strength"] = signal.get(tech, "none")
    else:
        no_service(d)
    if d["airplane_mode"] or d["active_apn_settings"]["apn_name"] == "broken" or not surroundings(db)["line_active"]:
        no_service(d)


def status_bar(db: DBView) -> str:
    d = device(db)
    shown = []
    if d["airplane_mode"]:
        shown.append("✈️ Airplane Mode")
    else:
        shown.append(_SIGNAL_ICON.get(d["network_signal_strength"], "📵 No Signal"))
        if d["network_technology_connected"] != "none":
            shown.append(d["network_technology_connected"])
        if d["data_enabled"] and d["network_technology_connected"] != "none":
            shown.append("📱 Data Enabled")
            if d["data_saver_mode"]:
                shown.append("🔽 Data Saver")
        else:
            shown.append("📵 Data Disabled")
    if d["wifi_enabled"] and d["wifi_connected"]:
        shown.append(f"📡 Connected to {d['wifi_ssid']}" if d["wifi_ssid"] else "📡 Enabled")
    if d["vpn_connected"]:
        shown.append("🔒 VPN Connected")
    shown.append(f"🔋 {d['battery_level']}%")
    return " | ".join(shown)


def with_bar(db: DBView, text: str) -> str:
    return f"{text}\nStatus Bar: {status_bar(db)}"


def mobile_data_working(db: DBView) -> bool:
    d, s = device(db), surroundings(db)
    if d["airplane_mode"] or d["network_signal_strength"] == "none":
        return False
    if d["network_connection_status"] == "no_service":
        return False
    if s["is_abroad"] and (not d["roaming_enabled"] or not s["roaming_allowed"]):
        return False
    return bool(d["data_enabled"]) and not s["mobile_data_usage_exceeded"]


def speed_test(db: DBView) -> tuple[float | None, str]:
    if not mobile_data_working(db):
        return None, "No Connection"
    d = device(db)
    vpn = d["vpn_details"]
    factor = 0.1 if d["vpn_connected"] and vpn and vpn["server_performance"] == "poor" else 1.0
    if d["data_saver_mode"]:
        factor *= 0.2
    low, high = _SPEED_RANGE.get(d["network_technology_connected"], (0.0, 0.0))
    speed = round((low + high) / 2.0 * _SIGNAL_FACTOR.get(d["network_signal_strength"], 0.0) * factor, 2)
    for limit, label in ((1, "Very Poor"), (5, "Poor"), (25, "Fair"), (100, "Good")):
        if speed < limit:
            return speed, label
    return speed, "Excellent"


def can_send_mms_now(db: DBView) -> bool:
    d = device(db)
    if not mobile_data_working(db) or d["network_technology_connected"] == "2G":
        return False
    if d["wifi_calling_enabled"] and d["wifi_calling_mms_over_wifi"]:
        return False
    if d["active_apn_settings"]["mmsc_url"] is None:
        return False
    app = d["app_statuses"].get("messaging")
    return app is not None and bool(app["permissions"]["storage"] and app["permissions"]["sms"])


def toggle_airplane(db: DBView) -> bool:
    d = edit_device(db)
    was_on = d["airplane_mode"]
    d["airplane_mode"] = not was_on
    if was_on:
        d["network_connection_status"] = "searching"
    if not was_on or d["wifi_enabled"]:
        d.update(wifi_connected=False, wifi_ssid=None, wifi_signal_strength="none")
    if not was_on and d["vpn_connected"]:
        d.update(vpn_connected=False, vpn_details=None)
    simulate_network_search(db)
    return d["airplane_mode"]


def toggle(db: DBView, key: str, search: bool = True) -> bool:
    d = edit_device(db)
    d[key] = not d[key]
    if search:
        simulate_network_search(db)
    return d[key]


def on_off(flag: bool) -> str:
    return "ON" if flag else "OFF"


def granted_permissions(app: dict) -> list[str]:
    return [name.replace("_", " ").lower() for name, granted in app["permissions"].items() if granted]


def set_permission(db: DBView, app_name: str, permission: str, value: bool) -> tuple[bool, str]:
    app = device(db)["app_statuses"].get(app_name)
    permission = permission.lower()
    if app is None:
        return False, f"App '{app_name}' not found. Cannot {'grant' if value else 'remove'} permission."
    if permission not in app["permissions"]:
        if value:
            return False, (f"Permission '{permission}' not tracked for app '{app_name}', "
                           f"available permissions: {list(app['permissions'])}")
        return False, f"Permission '{permission}' not tracked for app '{app_name}'."
    edit_device(db)["app_statuses"][app_name]["permissions"][permission] = value
    return True, f"Permission '{permission}' {'granted to' if value else 'removed from'} app '{app_name}'."


def default_vpn(db: DBView) -> dict:
    performance = (db.get("user", "vpn_default") or {}).get("server_performance", "excellent")
    return {"server_address": "192.168.1.1", "protocol": "OpenVPN", "server_performance": performance}
