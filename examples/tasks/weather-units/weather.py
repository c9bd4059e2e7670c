"""Unit conversions and a daily summary for a small weather station.

The sensors report temperatures in Fahrenheit and wind speeds in metres per second; the
summary is metric (degrees Celsius, km/h).
"""

KMH_PER_MS = 3.6


def celsius_to_fahrenheit(c):
    return c * 9 / 5 + 32


def fahrenheit_to_celsius(f):
    return f - 32 * 5 / 9


def ms_to_kmh(speed):
    return speed * KMH_PER_MS


def wind_chill(temp_c, wind_kmh):
    """Felt temperature in degrees Celsius (the North American wind chill index).

    Only defined for cold, windy weather; otherwise the air temperature is returned.
    """
    if temp_c > 10 or wind_kmh < 4.8:
        return temp_c
    v = wind_kmh ** 0.16
    return 13.12 + 0.6215 * temp_c - 11.37 * v + 0.3965 * temp_c * v


def daily_summary(readings):
    """readings: a list of (fahrenheit, wind in m/s) pairs.

    Returns the minimum, maximum and mean temperature in Celsius and the strongest wind in
    km/h, each rounded to one decimal.
    """
    temps = [fahrenheit_to_celsius(f) for f, _ in readings]
    winds = [ms_to_kmh(w) for _, w in readings]
    return {
        "min_c": round(min(temps), 1),
        "max_c": round(max(temps), 1),
        "mean_c": round(sum(temps) / len(temps), 1),
        "max_wind_kmh": round(max(winds), 1),
    }
