"""The telecom user's own tools: what they can check and change on their phone (tau2-bench
``domains/telecom/user_tools.py`` semantics; the phone and its rules: :mod:`.phone`). Resetting the APN
waits for a reboot.
"""

from __future__ import annotations

from typing import Annotated

from ctu.domains.base import ToolError, tool
from ctu.domains.telecom.data import default_apn
from ctu.domains.telecom.phone import (
    NETWORK_MODES,
    can_send_mms_now,
    default_vpn,
    device,
    edit_device,
    granted_permissions,
    on_off,
    set_permission,
    sim_status,
    simulate_network_search,
    speed_test,
    status_bar,
    surroundings,
    toggle,
    toggle_airplane,
    with_bar,
)

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


@tool()
def check_status_bar(db):
    """Shows what icons are currently visible in your phone's status bar (the area at the top of the screen). Displays network signal strength, mobile data status (enabled, disabled, data saver), Wi-Fi status, and battery level."""  # noqa: E501
    return f"Status Bar: {status_bar(db)}"


@tool()
def check_network_status(db):
    """Checks your phone's connection status to cellular networks and Wi-Fi. Shows airplane mode status, signal strength, network type, whether mobile data is enabled, and whether data roaming is enabled."""  # noqa: E501
    d = device(db)
    lines = [f"Airplane Mode: {on_off(d['airplane_mode'])}", f"SIM Card Status: {sim_status(d)}",
             f"Cellular Connection: {d['network_connection_status']}",
             f"Cellular Signal: {d['network_signal_strength']}",
             f"Cellular Network Type: {d['network_technology_connected']}",
             f"Mobile Data Enabled: {'Yes' if d['data_enabled'] else 'No'}",
             f"Data Roaming Enabled: {'Yes' if d['roaming_enabled'] else 'No'}",
             f"Wi-Fi Radio: {on_off(d['wifi_enabled'])}", f"Wi-Fi Connected: {'Yes' if d['wifi_connected'] else 'No'}"]
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
        return with_bar(db, f"Failed to set network mode: '{mode}' is not a valid option. "
                             f"Please use one of: {', '.join(NETWORK_MODES)}")
    edit_device(db)["network_mode_preference"] = mode
    simulate_network_search(db)
    return with_bar(db, f"Preferred Network Mode set to: {mode}")


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
    return with_bar(db, f"Airplane Mode is now {on_off(toggle_airplane(db))}.")


@tool()
def check_sim_status(db):
    """Checks if your SIM card is working correctly and displays its current status. Shows if the SIM is active, missing, or locked with a PIN or PUK code."""  # noqa: E501
    status = sim_status(device(db))
    return _SIM_TEXT.get(status, f"Unknown SIM status: {status}")


@tool(mutates=True)
def reseat_sim_card(db):
    """Simulates removing and reinserting your SIM card. This can help resolve recognition issues."""
    edit_device(db)["sim_card_missing"] = False
    simulate_network_search(db)
    return with_bar(db, "SIM card re-seated successfully.")


@tool(mutates=True)
def toggle_data(db):
    """Toggles your phone's mobile data connection ON or OFF. Controls whether your phone can use cellular data for internet access when Wi-Fi is unavailable.
Returns the new data connection status."""  # noqa: E501
    return with_bar(db, f"Mobile Data is now {on_off(toggle(db, 'data_enabled'))}.")


@tool(mutates=True)
def toggle_roaming(db):
    """Toggles Data Roaming ON or OFF. When ON, your phone can use data networks in areas outside your carrier's coverage.
Returns the new data roaming status."""  # noqa: E501
    return with_bar(db, f"Data Roaming is now {on_off(toggle(db, 'roaming_enabled'))}.")


@tool()
def check_data_restriction_status(db):
    """Checks if your phone has any data-limiting features active. Shows if Data Saver mode is on."""
    return "Data Saver mode is ON (limits data usage)." if device(db)["data_saver_mode"] else "Data Saver mode is OFF."


@tool(mutates=True)
def toggle_data_saver_mode(db):
    """Toggles Data Saver mode ON or OFF. When ON, it reduces data usage, which may affect data speed.
Returns the new data saver mode status."""
    return with_bar(db, f"Data Saver Mode is now {on_off(toggle(db, 'data_saver_mode', search=False))}.")


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
    edit_device(db)["active_apn_settings"] = settings
    simulate_network_search(db)
    return with_bar(db, f"APN settings set to: {settings['apn_name']}")


@tool(mutates=True)
def reset_apn_settings(db):
    """Resets your APN settings to the default settings."""
    edit_device(db)["active_apn_settings"]["reset_at_reboot"] = True
    simulate_network_search(db)
    return with_bar(db, "APN settings will reset at reboot.")


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
        return with_bar(db, "Cannot change Wi-Fi settings while Airplane Mode is ON.")
    d = edit_device(db)
    d["wifi_enabled"] = not d["wifi_enabled"]
    if not d["wifi_enabled"]:
        d.update(wifi_connected=False, wifi_ssid=None, wifi_signal_strength="none")
    return with_bar(db, f"Wi-Fi is now {on_off(d['wifi_enabled'])}.")


@tool()
def check_wifi_calling_status(db):
    """Checks if Wi-Fi Calling is enabled on your device. This feature allows you to make and receive calls over a Wi-Fi network instead of using the cellular network."""  # noqa: E501
    return f"Wi-Fi Calling is currently turned {on_off(device(db)['wifi_calling_enabled'])}."


@tool(mutates=True)
def toggle_wifi_calling(db):
    """Toggles Wi-Fi Calling ON or OFF. This feature allows you to make and receive calls over Wi-Fi instead of the cellular network, which can help in areas with weak cellular signal.
Returns the new Wi-Fi Calling status."""  # noqa: E501
    return with_bar(db, f"Wi-Fi Calling is now {on_off(toggle(db, 'wifi_calling_enabled', search=False))}.")


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




@tool(mutates=True)
def connect_vpn(db):
    """Connects to your VPN (Virtual Private Network)."""
    if device(db)["vpn_connected"]:
        return "VPN already connected."
    edit_device(db).update(vpn_connected=True, vpn_details=default_vpn(db))
    return with_bar(db, "VPN connected successfully.")


@tool(mutates=True)
def disconnect_vpn(db):
    """Disconnects any active VPN (Virtual Private Network) connection. Stops routing your internet traffic through a VPN server, which might affect connection speed or access to content."""  # noqa: E501
    if not device(db)["vpn_connected"]:
        return with_bar(db, "No active VPN connection to disconnect.")
    edit_device(db).update(vpn_connected=False, vpn_details=None)
    return with_bar(db, "VPN disconnected successfully.")


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
    granted = granted_permissions(app)
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
    granted = granted_permissions(app)
    if not granted:
        return f"App '{app_name}' currently has no permissions granted."
    return f"App '{app_name}' has permission for: {', '.join(granted)}."




@tool(mutates=True)
def grant_app_permission(db, app_name: Annotated[str, "The name of the app to grant the permission to."],
                         permission: Annotated[str, "The permission to grant, should be lowercase."]):
    """Gives a specific permission to an app (like access to storage, camera, or location). Required for some app functions to work properly."""  # noqa: E501
    ok, message = set_permission(db, app_name, permission, True)
    return with_bar(db, f"{'Success. ' if ok else 'Error. '}{message}")


@tool()
def can_send_mms(db):
    """Checks if the default messaging app can send MMS messages."""
    return "Your messaging app can send MMS messages." if can_send_mms_now(db) \
        else "Your messaging app cannot send MMS messages."


@tool(mutates=True)
def reboot_device(db):
    """Restarts your phone completely. This can help resolve many temporary software glitches by refreshing all running services and connections."""  # noqa: E501
    d, lines = edit_device(db), []
    if d["active_apn_settings"]["reset_at_reboot"]:
        lines.append("Resetting APN settings...")
        d["active_apn_settings"] = default_apn()
    lines.append("Restarting network services...")
    d["network_connection_status"] = "searching"
    simulate_network_search(db)
    return with_bar(db, "\n".join(lines))


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
