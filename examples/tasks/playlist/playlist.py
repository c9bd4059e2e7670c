"""Playlists for a small music library."""


class Track:
    def __init__(self, title, artist, seconds):
        self.title = title
        self.artist = artist
        self.seconds = seconds

    def __repr__(self):
        return f"Track({self.title!r}, {self.artist!r}, {self.seconds})"


def new_playlist(name, tracks=[]):
    """A playlist called `name`, optionally starting with some tracks."""
    return {"name": name, "tracks": tracks}


def add_track(playlist, track):
    """Append a track unless it is already there. Returns whether it was added."""
    if track in playlist["tracks"]:
        return False
    playlist["tracks"].append(track)
    return True


def total_seconds(playlist):
    return sum(track.seconds for track in playlist["tracks"])


def by_artist(playlist, artist):
    """The titles of the playlist's tracks by `artist`, in playlist order."""
    return [t.title for t in playlist["tracks"] if t.artist == artist]
