"""One control step (pure): observe-data -> forecast -> decide -> place, shared by the controller and the simulator."""
