"""Power EP (Bui, Yan & Turner 2017): sparse GPs from VFE (alpha -> 0) to FITC/EP (alpha = 1)."""
