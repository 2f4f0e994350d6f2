"""The columns of the device's alert row (one row per target) and the kinds of alert they flag, which saved files
name too: a module without torch, so reading a saved run's alerts (`hookstats report`) does not import it."""

# float columns are float64 bits in the int64 buffer
NONFINITE, DEAD_RUN, DEAD, EXPLODE, VANISH, EMA, EMA_N, EXPLODE_STD, EXPLODE_REF, VANISH_STD, VANISH_REF = range(11)
ROW_WIDTH = VANISH_REF + 1
FIRST_STEP_COLS = (NONFINITE, DEAD, EXPLODE, VANISH)
KIND_COLUMNS = ((NONFINITE, "nonfinite"), (DEAD, "dead"), (EXPLODE, "exploding_std"), (VANISH, "vanishing_std"))
ALERT_KINDS = tuple(kind for _, kind in KIND_COLUMNS)  # an alert's `kind`, in saved files too
