"""The telecom user's own tools: their phone (tau2-bench ``domains/telecom/user_tools.py`` semantics).

The phone is the ``user/device`` record; where the user is and what the carrier allows them is
``user/surroundings`` (kept in step with the carrier's records by :mod:`.coupling`). Rules kept
from tau2: changing airplane mode, SIM, mobile data, roaming, network mode or APN re-runs a
network search (SIM state, preference and the local signal decide the connection; airplane mode,
a broken APN or an inactive line mean no service); mobile data works only with signal, service,
data on, roaming allowed on both sides when abroad, and the data allowance not exceeded; the
speed test is the middle of the technology's range times the signal factor (x0.1 behind a poor
VPN, x0.2 with data saver); MMS needs working data, 3G or better, no Wi-Fi-calling MMS, an MMSC
URL and the messaging app's SMS and storage permissions; resetting the APN waits for a reboot.
tau2's VPN quirk: ``break_vpn`` degrades tau2's shared default VPN, so every later connection in
that process is poor; ctu keeps that within an episode (a ``user/vpn_default`` record).
"""

from __future__ import annotations

from typing import Annotated, Any

from ctu.domains.base import DBView, ToolError, tool
from ctu.domains.telecom.data import default_apn

NETWORK_MODES = ("4g_5g_preferred", "4g_only", "3g_only", "2g_only")
_MODE_TECH = {"4g_only": "4G", "3g_only": "3G", "2g_only": "2G"}
_SIGNAL_ICON = {"none": "📵 No Signal", "poor": "📶¹ Poor", "fair": "📶² Fair", "good": "📶³ Good",
                "excellent": "📶⁴ Excellent"}
_SPEED_RANGE = {"2G": (0.1, 0.4), "3G": (1.0, 5.0), "4G": (10.0, 100.0), "5G": (50.0, 500.0), "none": (0.0, 0.0)}
_SIGNAL_FACTOR = {"poor": 0.2, "fair": 0.5, "good": 0.8, "excellent": 1.0, "none": 0.0}
_SPEED_ADVICE = {
    "Very Poor": "Connection is very slow. Basic web browsing might be difficult.",
    "Poor": "Connection is slow. Web browsing may be sluggish, streaming difficult.",
    "Fair": "Connection is okay for web browsing and some standard definition streaming.",
    "Good": "Connection is good for most activities, including HD streaming.",
    "Excellent": "Connection is very fast.",
}
_SIM_TEXT = {"active": "Your SIM card is active and working.", "missing": "No SIM card detected in the phone.",
             "locked_pin": "The SIM card is locked with a PIN code.",
             "locked_puk": "The SIM card is locked with a PUK code."}


# -- state access --------------------------------------------------------------------------
def device(db: DBView) -> dict:
    return db.get("user", "device")


def surroundings(db: DBView) -> dict:
    return db.get("user", "surroundings")


def _edit(db: DBView) -> dict:
    return db.edit("user", "device")


def sim_status(d: dict) -> str:
    return "missing" if d["sim_card_missing"] else d["sim_card_status"]


def _no_service(d: dict) -> None:
    d.update(network_connection_status="no_service", network_technology_connected="none",
             network_signal_strength="none")


def simulate_network_search(db: DBView) -> None:
    """tau2's network search: the SIM, the mode preference and the local signal decide the connection."""
    d, signal = _edit(db), surroundings(db)["signal_strength"]
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
        _no_service(d)
    if d["airplane_mode"] or d["active_apn_settings"]["apn_name"] == "broken" or not surroundings(db)["line_active"]:
        _no_service(d)


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


def _with_bar(db: DBView, text: str) -> str:
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


def _toggle_airplane(db: DBView) -> bool:
    d = _edit(db)
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


def _toggle(db: DBView, key: str, search: bool = True) -> bool:
    d = _edit(db)
    d[key] = not d[key]
    if search:
        simulate_network_search(db)
    return d[key]


def _on_off(flag: bool) -> str:
    return "ON" if flag else "OFF"


def _permissions(app: dict) -> list[str]:
    return [name.replace("_", " ").lower() for name, granted in app["permissions"].items() if granted]


# -- tools -----------------------------------------------------------------------------------
@tool()
def check_status_bar(db):
    """Shows what icons are currently visible in your phone's status bar (the area at the top of the screen). Displays network signal strength, mobile data status (enabled, disabled, data saver), Wi-Fi status, and battery level."""  # noqa: E501
    return f"Status Bar: {status_bar(db)}"


@tool()
def check_network_status(db):
    """Checks your phone's connection status to cellular networks and Wi-Fi. Shows airplane mode status, signal strength, network type, whether mobile data is enabled, and whether data roaming is enabled."""  # noqa: E501
    d = device(db)
    lines = [f"Airplane Mode: {_on_off(d['airplane_mode'])}", f"SIM Card Status: {sim_status(d)}",
             f"Cellular Connection: {d['network_connection_status']}",
             f"Cellular Signal: {d['network_signal_strength']}",
             f"Cellular Network Type: {d['network_technology_connected']}",
             f"Mobile Data Enabled: {'Yes' if d['data_enabled'] else 'No'}",
             f"Data Roaming Enabled: {'Yes' if d['roaming_enabled'] else 'No'}",
             f"Wi-Fi Radio: {_on_off(d['wifi_enabled'])}", f"Wi-Fi Connected: {'Yes' if d['wifi_connected'] else 'No'}"]
    if d["wifi_connected"]:
        lines.append(f"Connected Wi-Fi Network: {d['wifi_ssid']}")
    return "\n".join(lines)


@tool()
def check_network_mode_preference(db):
    """Shows the current network mode preference."""
    return f"Network Mode Preference: {device(db)['network_mode_preference']}"


@tool(mutates=True)
def set_network_mode_preference(db, mode: Annotated[str, f"One of: {', '.join(NETWORK_MODES)}."]):
    """Changes the type of cellular network your phone prefers to connect to (e.g., 5G, LTE/4G, 3G). Higher-speed networks (LTE/5G) provide faster data but may use more battery."""  # noqa: E501
    if mode not in NETWORK_MODES:
        return _with_bar(db, f"Failed to set network mode: '{mode}' is not a valid option. "
                             f"Please use one of: {', '.join(NETWORK_MODES)}")
    _edit(db)["network_mode_preference"] = mode
    simulate_network_search(db)
    return _with_bar(db, f"Preferred Network Mode set to: {mode}")


@tool()
def run_speed_test(db):
    """Measures your current internet connection speed (download speed). Provides information about connection quality and what activities it can support."""  # noqa: E501
    speed, label = speed_test(db)
    if speed is None:
        return f"Speed test failed: {label or 'Could not determine speed'}."
    return f"Speed Test Result: {speed:.2f} Mbps ({label}). {_SPEED_ADVICE.get(label, '')}"


@tool(mutates=True)
def toggle_airplane_mode(db):
    """Toggles Airplane Mode ON or OFF. When ON, it disconnects all wireless communications including cellular, Wi-Fi, and Bluetooth.
Returns the new state of airplane_mode."""  # noqa: E501
    return _with_bar(db, f"Airplane Mode is now {_on_off(_toggle_airplane(db))}.")


@tool()
def check_sim_status(db):
    """Checks if your SIM card is working correctly and displays its current status. Shows if the SIM is active, missing, or locked with a PIN or PUK code."""  # noqa: E501
    status = sim_status(device(db))
    return _SIM_TEXT.get(status, f"Unknown SIM status: {status}")


@tool(mutates=True)
def reseat_sim_card(db):
    """Simulates removing and reinserting your SIM card. This can help resolve recognition issues."""
    _edit(db)["sim_card_missing"] = False
    simulate_network_search(db)
    return _with_bar(db, "SIM card re-seated successfully.")


@tool(mutates=True)
def toggle_data(db):
    """Toggles your phone's mobile data connection ON or OFF. Controls whether your phone can use cellular data for internet access when Wi-Fi is unavailable.
Returns the new data connection status."""  # noqa: E501
    return _with_bar(db, f"Mobile Data is now {_on_off(_toggle(db, 'data_enabled'))}.")


@tool(mutates=True)
def toggle_roaming(db):
    """Toggles Data Roaming ON or OFF. When ON, your phone can use data networks in areas outside your carrier's coverage.
Returns the new data roaming status."""  # noqa: E501
    return _with_bar(db, f"Data Roaming is now {_on_off(_toggle(db, 'roaming_enabled'))}.")


@tool()
def check_data_restriction_status(db):
    """Checks if your phone has any data-limiting features active. Shows if Data Saver mode is on."""
    return "Data Saver mode is ON (limits data usage)." if device(db)["data_saver_mode"] else "Data Saver mode is OFF."


@tool(mutates=True)
def toggle_data_saver_mode(db):
    """Toggles Data Saver mode ON or OFF. When ON, it reduces data usage, which may affect data speed.
Returns the new data saver mode status."""
    return _with_bar(db, f"Data Saver Mode is now {_on_off(_toggle(db, 'data_saver_mode', search=False))}.")


@tool()
def check_apn_settings(db):
    """Checks the technical APN settings your phone uses to connect to your carrier's mobile data network. Shows current APN name and MMSC URL for picture messaging."""  # noqa: E501
    apn = device(db)["active_apn_settings"]
    return (f"Current APN Name: {apn['apn_name'] or 'Not Set'}\nMMSC URL (for picture messages): "
            f"{apn['mmsc_url'] or 'Not Set'}\n(These are technical settings, usually best left unchanged.)")


@tool(mutates=True)
def set_apn_settings(db, apn_settings: Annotated[dict, "The APN settings: apn_name ('internet' or 'broken'), "
                                                       "reset_at_reboot, mms_apn, mmsc_url, mms_proxy, mms_port."]):
    """Sets the APN settings for the phone."""
    settings = default_apn()
    extra = set(apn_settings) - set(settings)
    if extra:
        raise ToolError(f"unknown APN setting(s): {', '.join(sorted(extra))}")
    settings.update(apn_settings)
    if settings["apn_name"] not in ("internet", "broken"):
        raise ToolError(f"apn_name must be 'internet' or 'broken', got {settings['apn_name']!r}")
    _edit(db)["active_apn_settings"] = settings
    simulate_network_search(db)
    return _with_bar(db, f"APN settings set to: {settings['apn_name']}")


@tool(mutates=True)
def reset_apn_settings(db):
    """Resets your APN settings to the default settings."""
    _edit(db)["active_apn_settings"]["reset_at_reboot"] = True
    simulate_network_search(db)
    return _with_bar(db, "APN settings will reset at reboot.")


@tool()
def check_wifi_status(db):
    """Checks your Wi-Fi connection status. Shows if Wi-Fi is turned on, which network you're connected to (if any), and the signal strength."""  # noqa: E501
    d = device(db)
    if not d["wifi_enabled"]:
        return "Wi-Fi is turned OFF."
    if d["wifi_connected"]:
        return f"Wi-Fi is ON and connected to '{d['wifi_ssid']}'. Signal strength: {d['wifi_signal_strength']}."
    return "Wi-Fi is ON but not connected to any network."


@tool(mutates=True)
def toggle_wifi(db):
    """Toggles your phone's Wi-Fi radio ON or OFF. Controls whether your phone can discover and connect to wireless networks for internet access.
Returns the new Wi-Fi status."""  # noqa: E501
    if device(db)["airplane_mode"]:
        return _with_bar(db, "Cannot change Wi-Fi settings while Airplane Mode is ON.")
    d = _edit(db)
    d["wifi_enabled"] = not d["wifi_enabled"]
    if not d["wifi_enabled"]:
        d.update(wifi_connected=False, wifi_ssid=None, wifi_signal_strength="none")
    return _with_bar(db, f"Wi-Fi is now {_on_off(d['wifi_enabled'])}.")


@tool()
def check_wifi_calling_status(db):
    """Checks if Wi-Fi Calling is enabled on your device. This feature allows you to make and receive calls over a Wi-Fi network instead of using the cellular network."""  # noqa: E501
    return f"Wi-Fi Calling is currently turned {_on_off(device(db)['wifi_calling_enabled'])}."


@tool(mutates=True)
def toggle_wifi_calling(db):
    """Toggles Wi-Fi Calling ON or OFF. This feature allows you to make and receive calls over Wi-Fi instead of the cellular network, which can help in areas with weak cellular signal.
Returns the new Wi-Fi Calling status."""  # noqa: E501
    return _with_bar(db, f"Wi-Fi Calling is now {_on_off(_toggle(db, 'wifi_calling_enabled', search=False))}.")


def _vpn_repr(details: dict) -> str:
    """``str(VpnDetails.model_dump())`` as tau2 shows it (the enum's repr included)."""
    perf = details["server_performance"]
    return (f"{{'server_address': {details['server_address']!r}, 'protocol': {details['protocol']!r}, "
            f"'server_performance': <PerformanceLevel.{perf.upper()}: {perf!r}>}}")


@tool()
def check_vpn_status(db):
    """Checks if you're using a VPN (Virtual Private Network) connection. Shows if a VPN is active, connected, and displays any available connection details."""  # noqa: E501
    d = device(db)
    if d["vpn_connected"]:
        if d["vpn_details"]:
            return f"VPN is ON and connected. Details: {_vpn_repr(d['vpn_details'])}"
        return "VPN is ON and connected (no specific details available)."
    return "VPN is turned ON in settings, but currently not connected." if d["vpn_enabled_setting"] \
        else "VPN is turned OFF."


def _default_vpn(db: DBView) -> dict:
    performance = (db.get("user", "vpn_default") or {}).get("server_performance", "excellent")
    return {"server_address": "192.168.1.1", "protocol": "OpenVPN", "server_performance": performance}


@tool(mutates=True)
def connect_vpn(db):
    """Connects to your VPN (Virtual Private Network)."""
    if device(db)["vpn_connected"]:
        return "VPN already connected."
    _edit(db).update(vpn_connected=True, vpn_details=_default_vpn(db))
    return _with_bar(db, "VPN connected successfully.")


@tool(mutates=True)
def disconnect_vpn(db):
    """Disconnects any active VPN (Virtual Private Network) connection. Stops routing your internet traffic through a VPN server, which might affect connection speed or access to content."""  # noqa: E501
    if not device(db)["vpn_connected"]:
        return _with_bar(db, "No active VPN connection to disconnect.")
    _edit(db).update(vpn_connected=False, vpn_details=None)
    return _with_bar(db, "VPN disconnected successfully.")


@tool()
def check_installed_apps(db):
    """Returns the name of all installed apps on the phone."""
    return f"The following apps are installed on the phone: {', '.join(device(db)['app_statuses'])}"


@tool()
def check_app_status(db, app_name: Annotated[str, "The name of the app."]):
    """Checks detailed information about a specific app. Shows its permissions and background data usage settings."""
    app = device(db)["app_statuses"].get(app_name)
    if app is None:
        return f"App '{app_name}' not found on this phone."
    granted = _permissions(app)
    lines = [f"Status for App: {app_name}"]
    lines += [" - Permissions Granted:", *(f"   - {p}" for p in granted)] if granted else \
        [" - Permissions: None granted."]
    return "\n".join(lines)


@tool()
def check_app_permissions(db, app_name: Annotated[str, "The name of the app."]):
    """Checks what permissions a specific app currently has. Shows if the app has access to features like storage, camera, location, etc."""  # noqa: E501
    app = device(db)["app_statuses"].get(app_name)
    if app is None:
        return f"App '{app_name}' not found on this phone."
    granted = _permissions(app)
    if not granted:
        return f"App '{app_name}' currently has no permissions granted."
    return f"App '{app_name}' has permission for: {', '.join(granted)}."


def _set_permission(db: DBView, app_name: str, permission: str, value: bool) -> tuple[bool, str]:
    app = device(db)["app_statuses"].get(app_name)
    permission = permission.lower()
    if app is None:
        return False, f"App '{app_name}' not found. Cannot {'grant' if value else 'remove'} permission."
    if permission not in app["permissions"]:
        if value:
            return False, (f"Permission '{permission}' not tracked for app '{app_name}', "
                           f"available permissions: {list(app['permissions'])}")
        return False, f"Permission '{permission}' not tracked for app '{app_name}'."
    _edit(db)["app_statuses"][app_name]["permissions"][permission] = value
    return True, f"Permission '{permission}' {'granted to' if value else 'removed from'} app '{app_name}'."


@tool(mutates=True)
def grant_app_permission(db, app_name: Annotated[str, "The name of the app to grant the permission to."],
                         permission: Annotated[str, "The permission to grant, should be lowercase."]):
    """Gives a specific permission to an app (like access to storage, camera, or location). Required for some app functions to work properly."""  # noqa: E501
    ok, message = _set_permission(db, app_name, permission, True)
    return _with_bar(db, f"{'Success. ' if ok else 'Error. '}{message}")


@tool()
def can_send_mms(db):
    """Checks if the default messaging app can send MMS messages."""
    return "Your messaging app can send MMS messages." if can_send_mms_now(db) \
        else "Your messaging app cannot send MMS messages."


@tool(mutates=True)
def reboot_device(db):
    """Restarts your phone completely. This can help resolve many temporary software glitches by refreshing all running services and connections."""  # noqa: E501
    d, lines = _edit(db), []
    if d["active_apn_settings"]["reset_at_reboot"]:
        lines.append("Resetting APN settings...")
        d["active_apn_settings"] = default_apn()
    lines.append("Restarting network services...")
    d["network_connection_status"] = "searching"
    simulate_network_search(db)
    return _with_bar(db, "\n".join(lines))


@tool()
def check_payment_request(db):
    """Checks if the agent has sent you a payment request."""
    request = surroundings(db)["payment_request"]
    if request is None:
        return "No payment request has been made."
    return f"You have a payment request for bill {request['bill_id']} of {request['amount_due']} USD."


@tool(mutates=True)
def make_payment(db):
    """Makes a payment for the bill that the agent has sent you."""
    request = surroundings(db)["payment_request"]
    if request is None:
        return "You do not have a payment request."
    db.edit("user", "surroundings")["payment_request"]["paid"] = True
    return f"Payment of {request['amount_due']} USD has been made for bill {request['bill_id']}."


USER_TOOLS = (check_status_bar, check_network_status, check_network_mode_preference, set_network_mode_preference,
              run_speed_test, toggle_airplane_mode, check_sim_status, reseat_sim_card, toggle_data, toggle_roaming,
              check_data_restriction_status, toggle_data_saver_mode, check_apn_settings, set_apn_settings,
              reset_apn_settings, check_wifi_status, toggle_wifi, check_wifi_calling_status, toggle_wifi_calling,
              check_vpn_status, connect_vpn, disconnect_vpn, check_installed_apps, check_app_status,
              check_app_permissions, grant_app_permission, can_send_mms, reboot_device, check_payment_request,
              make_payment)


# -- functions tasks call on the user's side (initial states, env assertions) ------------------
def set_user_info(db: DBView, name: str, phone_number: str) -> None:
    db.edit("user", "surroundings").update(name=name, phone_number=phone_number)


def set_user_location(db: DBView, abroad: bool) -> None:
    db.edit("user", "surroundings")["is_abroad"] = abroad


def _set_flag(db: DBView, key: str, value: bool, toggle) -> None:
    """tau2's ``turn_*_on/off``: toggle, and toggle again if that went the wrong way."""
    if toggle(db) != value:
        toggle(db)


def turn_airplane_mode_on(db: DBView) -> str:
    _set_flag(db, "airplane_mode", True, _toggle_airplane)
    return "Airplane Mode is now ON."


def turn_airplane_mode_off(db: DBView) -> str:
    _set_flag(db, "airplane_mode", False, _toggle_airplane)
    return "Airplane Mode is now OFF."


def unseat_sim_card(db: DBView) -> str:
    _edit(db)["sim_card_missing"] = True
    simulate_network_search(db)
    return "SIM card un-seated successfully."


def lock_sim_card(db: DBView, mode: str) -> str:
    if mode in ("pin", "puk"):
        _edit(db)["sim_card_status"] = f"locked_{mode}"
    simulate_network_search(db)
    return f"SIM card locked successfully in {mode} mode."


def turn_data_on(db: DBView) -> str:
    _edit(db)["data_enabled"] = True  # tau2: no network search here
    return "Data connection restored."


def turn_data_off(db: DBView) -> str:
    _set_flag(db, "data_enabled", False, lambda v: _toggle(v, "data_enabled"))
    return "Data connection broken."


def turn_roaming_on(db: DBView) -> str:
    _set_flag(db, "roaming_enabled", True, lambda v: _toggle(v, "roaming_enabled"))
    return "Data Roaming is now ON."


def turn_roaming_off(db: DBView) -> str:
    _set_flag(db, "roaming_enabled", False, lambda v: _toggle(v, "roaming_enabled"))
    return "Data Roaming is now OFF."


def turn_data_saver_mode_on(db: DBView) -> str:
    _set_flag(db, "data_saver_mode", True, lambda v: _toggle(v, "data_saver_mode", search=False))
    return "Data Saver Mode is now ON."


def turn_data_saver_mode_off(db: DBView) -> str:
    _set_flag(db, "data_saver_mode", False, lambda v: _toggle(v, "data_saver_mode", search=False))
    return "Data Saver Mode is now OFF."


def break_apn_settings(db: DBView) -> str:
    _edit(db)["active_apn_settings"]["apn_name"] = "broken"
    simulate_network_search(db)
    return "APN settings broken. Please call reset_apn_settings() to fix."


def break_apn_mms_setting(db: DBView) -> str:
    _edit(db)["active_apn_settings"]["mmsc_url"] = None
    return "APN MMS setting broken. Please call reset_apn_settings() to fix."


def set_wifi_calling(db: DBView, enabled: bool, mms_over_wifi: bool | None = None) -> str:
    d = _edit(db)
    d["wifi_calling_enabled"] = enabled
    message = f"Wi-Fi Calling is now {_on_off(enabled)}."
    if mms_over_wifi is not None:
        d["wifi_calling_mms_over_wifi"] = mms_over_wifi
        message += f"\nMMS over Wi-Fi is now {_on_off(mms_over_wifi)}."
    return message


def break_vpn(db: DBView) -> str:
    connect_vpn.effect(db)
    db.put("user", "vpn_default", {"server_performance": "poor"})  # tau2 degrades its shared default VPN
    details = device(db)["vpn_details"]
    _edit(db)["vpn_details"] = {**details, "server_performance": "poor"}
    return "VPN connection broken."


def remove_app_permission(db: DBView, app_name: str, permission: str) -> tuple[bool, str]:
    return _set_permission(db, app_name, permission, False)


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
