"""Book a clinic appointment: search clinics by specialty, insurance and day, pick the earliest slot that fits the
goal (a time window, and a doctor's gender or language where it says), fill in the patient, confirm.

The site is three pages and a confirmation, rendered from templates/ by its backend (`ClinicSite`, one per episode,
below the task); `validate` reads the appointments the backend recorded. Each instance has a trap for each way to end
wrong: a later slot that fits, an earlier one at a clinic that does not take the insurance, and where the goal asks
for a doctor, an earlier slot with another.
"""

from dataclasses import dataclass
from html import escape
from pathlib import Path
from string import Template
from urllib.parse import parse_qs, urlencode

from browsergym.core.registration import register_task
from browsergym.core.task import AbstractBrowserTask

from web_env.task_app import serve_app

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"  # the pages, filled in by the backend; app/ holds what is served as it is


class BookClinicAppointment(AbstractBrowserTask):
    @classmethod
    def get_task_id(cls):
        return "book-clinic"

    def __init__(self, seed):
        super().__init__(seed)
        self.instance = Instance(self.random)
        self.patient = {
            "name": self.instance.pick(PATIENT_NAMES),
            "birth_date": f"{self.random.randint(1945, 2005)}-{self.random.randint(1, 13):02d}-"
            f"{self.random.randint(1, 29):02d}",
            "phone": f"555-{self.random.randint(100, 10000):04d}",
        }

    def setup(self, page):
        self.site = ClinicSite(self.instance)
        url = serve_app(page, HERE / "app", backend=self.site)
        page.goto(url)
        return self.instance.goal(self.patient), {}

    def validate(self, page, chat_messages):
        if not self.site.appointments:
            return 0.0, False, "", {}
        return float(self.site.appointments == [{"slot": self.instance.answer.id, **self.patient}]), True, "", {}

    def cheat(self, page, chat_messages):
        self.book(page, self.instance.answer, self.patient)

    def book_a_later_slot(self, page):
        self.book(page, self.instance.later, self.patient)

    def book_where_the_insurance_is_not_taken(self, page):
        self.book(page, self.instance.uninsured, self.patient)

    def book_another_doctor(self, page):
        self.book(page, self.instance.other_doctor or self.instance.later, self.patient)

    def book_with_a_wrong_birth_date(self, page):
        year_month, day = self.patient["birth_date"].rsplit("-", 1)  # days are drawn from 1 to 28: the next one differs
        self.book(page, self.instance.answer, {**self.patient, "birth_date": f"{year_month}-{int(day) % 28 + 1:02d}"})

    wrong_endings = (
        book_a_later_slot,
        book_where_the_insurance_is_not_taken,
        book_another_doctor,
        book_with_a_wrong_birth_date,
    )

    def book(self, page, slot: "Slot", patient: dict):
        """Through the site as a person would; with any insurance, so that an uninsured clinic's slots are listed."""
        page.get_by_label("Specialty").select_option(self.instance.specialty)
        page.get_by_label("Day").select_option(slot.day)
        page.get_by_role("button", name="Search").click()
        page.get_by_role("link", name=slot.label()).click()
        page.get_by_label("Patient name").fill(patient["name"])
        page.get_by_label("Date of birth (YYYY-MM-DD)").fill(patient["birth_date"])
        page.get_by_label("Phone").fill(patient["phone"])
        page.get_by_role("button", name="Confirm appointment").click()


register_task("book-clinic", BookClinicAppointment)


SPECIALTIES = ["cardiology", "dermatology", "neurology", "orthopedics", "pediatrics"]
INSURANCES = ["Aetna", "Cigna", "Humana", "Medicare", "UnitedHealth"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
LANGUAGES = ["Arabic", "French", "Mandarin", "Spanish", "Vietnamese"]
PLACES = ["Riverside", "Oak Hill", "Lakeview", "Maple", "Summit", "Harbor", "Cedar", "Northgate", "Westside", "Parkway"]
KINDS = ["Clinic", "Medical Center", "Health", "Care"]
FIRST_NAMES = {
    "female": ["Ana", "Grace", "Mei", "Nadia", "Olivia", "Priya", "Sara", "Yara"],
    "male": ["Ben", "Carlos", "David", "Hiro", "Karim", "Luis", "Omar", "Tom"],
}
LAST_NAMES = ["Adams", "Baker", "Chen", "Diaz", "Evans", "Garcia", "Khan", "Lee", "Moreau", "Nguyen", "Ortiz", "Patel"]
PATIENT_NAMES = ["Alex Morgan", "Jamie Fox", "Robin Hale", "Sam Rivera", "Taylor Brooks", "Jordan Kim", "Casey Wong"]
HALF_HOURS = [8 * 60 + 30 * k for k in range(20)]  # 08:00 to 17:30


def clock(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


@dataclass(frozen=True)
class Doctor:
    name: str
    gender: str
    languages: tuple[str, ...]

    def describe(self) -> str:
        return f"{self.gender}; speaks {', '.join(self.languages)}"


@dataclass(frozen=True)
class Slot:
    id: str
    clinic: int
    doctor: Doctor
    day: str
    minutes: int

    def label(self) -> str:
        return f"{self.day} {clock(self.minutes)} with {self.doctor.name}"


@dataclass(frozen=True)
class Clinic:
    name: str
    specialty: str
    insurances: tuple[str, ...]


class Instance:
    """One seed's clinics, doctors, slots and goal; drawn again until it holds every trap (see `traps`)."""

    def __init__(self, random):
        self.random = random
        while not self.draw():
            pass

    def pick(self, items, count=None):
        chosen = self.random.choice(len(items), size=count or 1, replace=False)
        return [items[i] for i in chosen] if count else items[chosen[0]]

    def draw(self) -> bool:
        self.specialty, self.insurance, self.day = self.pick(SPECIALTIES), self.pick(INSURANCES), self.pick(DAYS)
        self.start = self.pick(HALF_HOURS[:12])
        self.end = self.start + 60 * int(self.random.randint(2, 5))
        self.wants = [None, ("gender", "female"), ("gender", "male"), ("language", self.pick(LANGUAGES))][
            self.random.randint(4)
        ]
        self.clinics, self.slots = [], []
        names = [f"{place} {self.pick(KINDS)}" for place in self.pick(PLACES, 6)]
        doctors = self.doctors(2 * len(names))
        for n, name in enumerate(names):
            specialty = self.specialty if n < 4 else self.pick([s for s in SPECIALTIES if s != self.specialty])
            others = self.pick([i for i in INSURANCES if i != self.insurance], 2)
            insurances = sorted(others + [self.insurance]) if n in (0, 1, 4) else sorted(others)
            self.clinics.append(Clinic(name, specialty, tuple(insurances)))
            for doctor in doctors[2 * n : 2 * n + 2]:
                for day in DAYS:
                    for minutes in sorted(self.pick(HALF_HOURS, int(self.random.randint(1, 4)))):
                        self.slots.append(Slot(f"{n}-{len(self.slots)}", n, doctor, day, int(minutes)))
        self.clinics_order = [int(n) for n in self.random.permutation(len(self.clinics))]  # as the results list them
        return self.traps()

    def doctors(self, count: int) -> list[Doctor]:
        doctors, names = [], set()
        while len(doctors) < count:
            gender = self.pick(["female", "male"])
            name = f"Dr. {self.pick(FIRST_NAMES[gender])} {self.pick(LAST_NAMES)}"
            if name not in names:
                names.add(name)
                languages = ("English",) + ((self.pick(LANGUAGES),) if self.random.rand() < 0.6 else ())
                doctors.append(Doctor(name, gender, languages))
        return doctors

    def fits(self, slot: Slot) -> bool:
        doctor_fits = (
            self.wants is None
            or (self.wants[0] == "gender" and slot.doctor.gender == self.wants[1])
            or (self.wants[0] == "language" and self.wants[1] in slot.doctor.languages)
        )
        return slot.day == self.day and self.start <= slot.minutes <= self.end and doctor_fits

    def takes_insurance(self, slot: Slot) -> bool:
        clinic = self.clinics[slot.clinic]
        return clinic.specialty == self.specialty and self.insurance in clinic.insurances

    def traps(self) -> bool:
        """The earliest fitting slot at a clinic that takes the insurance is the one answer, and each wrong ending
        has its slot: a later fitting one, an earlier fitting one elsewhere, an earlier one with another doctor."""
        right = sorted((s for s in self.slots if self.fits(s) and self.takes_insurance(s)), key=lambda s: s.minutes)
        if len(right) < 2 or right[0].minutes == right[1].minutes:
            return False
        self.answer, self.later = right[0], right[1]
        earlier = [s for s in self.slots if s.day == self.day and s.minutes < self.answer.minutes]
        self.uninsured = next(
            (s for s in earlier if self.fits(s) and self.clinics[s.clinic].specialty == self.specialty), None
        )
        self.other_doctor = next(
            (s for s in earlier if self.takes_insurance(s) and self.start <= s.minutes and not self.fits(s)), None
        )
        return self.uninsured is not None and (self.wants is None or self.other_doctor is not None)

    def goal(self, patient: dict) -> str:
        if self.wants is None:
            doctor = ""
        elif self.wants[0] == "gender":
            doctor = f" with a {self.wants[1]} doctor"
        else:
            doctor = f" with a doctor who speaks {self.wants[1]}"
        return (
            f"Book the earliest {self.specialty} appointment on {self.day} starting between {clock(self.start)} and "
            f"{clock(self.end)}{doctor}, at a clinic that takes {self.insurance}. Patient: {patient['name']}, "
            f"born {patient['birth_date']}, phone {patient['phone']}."
        )


class ClinicSite:
    """The site's backend, a WSGI app: its pages (templates/, filled in here), and the appointments booked, one list
    per episode."""

    def __init__(self, instance: Instance):
        self.instance = instance
        self.appointments = []

    def __call__(self, environ, start_response):
        path, query = environ["PATH_INFO"], parse_qs(environ["QUERY_STRING"])
        if environ["REQUEST_METHOD"] == "POST" and path == "/appointments":
            form = {key: values[0] for key, values in parse_qs(environ["wsgi.input"].read().decode()).items()}
            self.appointments.append(form)
            start_response("303 See Other", [("Location", "/confirmed")])
            return [b""]
        pages = {"/": self.search, "/clinics": self.results, "/book": self.booking, "/confirmed": self.confirmed}
        if path not in pages:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found"]
        body = pages[path]({key: values[0] for key, values in query.items()})
        start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
        return [render("page.html", body=body).encode()]

    def search(self, query: dict) -> str:
        return render(
            "search.html",
            specialties=options(["Any specialty"] + SPECIALTIES),
            insurances=options(["Any insurance"] + INSURANCES),
            days=options(["Any day"] + DAYS),
        )

    def results(self, query: dict) -> str:
        instance, sections = self.instance, []
        for n in instance.clinics_order:
            clinic = instance.clinics[n]
            if query.get("specialty") in SPECIALTIES and clinic.specialty != query["specialty"]:
                continue
            if query.get("insurance") in INSURANCES and query["insurance"] not in clinic.insurances:
                continue
            slots = [s for s in instance.slots if s.clinic == n and query.get("day") in (s.day, None, "Any day")]
            items = "".join(
                render(
                    "slot.html", query=urlencode({"slot": s.id}), label=escape(s.label()), doctor=s.doctor.describe()
                )
                for s in sorted(slots, key=lambda s: (DAYS.index(s.day), s.minutes))
            )
            sections.append(
                render(
                    "clinic.html",
                    name=escape(clinic.name),
                    specialty=clinic.specialty,
                    insurances=", ".join(clinic.insurances),
                    slots=items or render("no_slots.html"),
                )
            )
        return render("results.html", clinics="".join(sections) or render("no_clinics.html"))

    def booking(self, query: dict) -> str:
        slot = next((s for s in self.instance.slots if s.id == query.get("slot")), None)
        if slot is None:
            return render("slot_gone.html")
        clinic = self.instance.clinics[slot.clinic].name
        return render("booking.html", slot=escape(slot.label()), clinic=escape(clinic), slot_id=slot.id)

    def confirmed(self, query: dict) -> str:
        return render("confirmed.html")


def render(template: str, **values: str) -> str:
    """A page or part of one: the template file with its $names filled in (text escaped by the caller)."""
    return Template((TEMPLATES / template).read_text()).substitute(values)


def options(items: list[str]) -> str:
    return "".join(render("option.html", option=escape(item)) for item in items)
